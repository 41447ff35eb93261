//! Opening a session: ACCEPT with a fresh session id, then the further
//! channels (and post-copy's two connections) joining it.

use super::config::DestConfig;
use crate::stream_error::MigrateError;
use crate::transport::{Admission, BoxConn, Connection, Listener, Opener, Refused};
use crate::wire::{tag, Header, Opening, WireReader, WireWriter, SESSION_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accepts connections joining a session: the channel numbers wanted, in
/// that order, waiting at most the given time.
pub(crate) type Join<'a> = dyn FnMut(&[u8; SESSION_LEN], &[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError>
    + 'a;

/// A connection's opening, read on its own thread once it authenticated.
pub(super) type Opened = (WireReader<BoxConn>, Opening);

/// Reads an authenticated connection's opening within one record's
/// deadline (`grace` the I/O timeout).
pub(super) fn opener(grace: Duration) -> Arc<Opener<Opened>> {
    Arc::new(move |conn| WireReader::replies(conn).with_grace(grace).read_opening())
}

/// The connections refused so far.
#[derive(Default)]
pub(super) struct Refusals {
    pub(super) count: u64,
    pub(super) last: String,
    pub(super) last_error: Option<MigrateError>,
}

impl Refusals {
    /// Notes a refusal: always to `refused` (the control socket's
    /// `last_error`), on stderr the first ten and then every
    /// power-of-two-th, so a flood of strangers cannot flood the log.
    pub(super) fn note(&mut self, why: String, refused: &mut dyn FnMut(&str)) {
        self.count += 1;
        if self.count <= 10 || self.count.is_power_of_two() {
            eprintln!(
                "destination: refused a connection ({} so far): {why}; still listening",
                self.count
            );
        }
        refused(&why);
        self.last = why;
    }

    /// Notes a connection refused by the admission.
    pub(super) fn note_refused(&mut self, peer: String, r: Refused, refused: &mut dyn FnMut(&str)) {
        let why = match &r.error {
            _ if r.authenticated => format!("{peer} authenticated, then: {}", r.error),
            MigrateError::Auth { .. } => format!(
                "a connection from {peer} failed authentication: {}",
                r.error
            ),
            // Anything else (with plain TCP, which has no authentication,
            // a bad opening) is named by its own error.
            e => format!("a connection from {peer} was refused: {e}"),
        };
        self.note(why, refused);
        self.last_error = Some(r.error);
    }
}

/// Which of `wanted` an opened connection fills (not filled yet, of
/// `session`), or why it is refused.
fn place(
    peer: String,
    opened: Opened,
    session: &[u8; SESSION_LEN],
    wanted: &[u16],
    got: &[Option<WireReader<BoxConn>>],
) -> Result<(usize, WireReader<BoxConn>), String> {
    match opened {
        (
            rd,
            Opening::Join {
                session: s,
                channel,
            },
        ) if &s == session => match wanted.iter().position(|&c| c == channel) {
            Some(k) if got[k].is_none() => Ok((k, rd)),
            Some(_) => Err(format!("{peer} joined channel {channel} a second time")),
            None => Err(format!("{peer} joined channel {channel}, not one awaited")),
        },
        (_, Opening::Join { .. }) => Err(format!(
            "{peer} authenticated but joined another session (not this migration's)"
        )),
        (_, Opening::Main(_)) => Err(format!(
            "{peer} opened a new migration, not a channel of this one"
        )),
    }
}

/// Accepts the source's connections that join `session` with the channel
/// numbers `wanted` (its further channels; post-copy's recovery): each
/// must authenticate and join with a wanted number not seen yet. Each
/// authenticates on a thread of its own (`admission`: strangers have a
/// budget of their own, the oldest evicted first), so a peer that stalls
/// cannot hold the source's back. `admission` may be the one that admitted
/// the main connection: a source opens its further connections while the
/// main one is still in its setup (their TLS and key exchange run then;
/// each JOIN comes after ACCEPT), and those accepted before ACCEPT are
/// still in it. Others are
/// refused (dropped, each named to `refused`: a failed authentication,
/// another session's id, garbage, a stall past the I/O deadline) and the
/// wait goes on; it ends after `wait`. Returns them in `wanted`'s order.
///
/// # Errors
/// [`MigrateError::JoinRefused`] when the wait passed after connections
/// were refused (it names the last), [`MigrateError::Timeout`] when it
/// passed with none at all, [`MigrateError::Io`] when accepting failed.
pub(super) fn join_channels(
    listener: &dyn Listener,
    admission: &mut Admission<Opened>,
    wait: Duration,
    session: &[u8; SESSION_LEN],
    wanted: &[u16],
    refused: &mut dyn FnMut(&str),
) -> Result<Vec<WireReader<BoxConn>>, MigrateError> {
    let mut got: Vec<Option<WireReader<BoxConn>>> = wanted.iter().map(|_| None).collect();
    let deadline = Instant::now() + wait;
    let mut no = Refusals::default();
    loop {
        if got.iter().all(Option::is_some) {
            return Ok(got.into_iter().flatten().collect());
        }
        match admission.next(listener, Some(deadline))? {
            Some((peer, Ok(opened))) => match place(peer, opened, session, wanted, &got) {
                Ok((k, rd)) => got[k] = Some(rd),
                Err(why) => no.note(why, refused),
            },
            Some((peer, Err(r))) => no.note_refused(peer, r, refused),
            None if no.count == 0 => {
                return Err(MigrateError::Timeout {
                    what: "waiting for the source's further channels".into(),
                })
            }
            None => {
                return Err(MigrateError::JoinRefused {
                    wait,
                    refused: no.count,
                    last: no.last,
                })
            }
        }
    }
}

/// Accepts the stream (ACCEPT with a fresh session id) and waits for the
/// further channels to join it; returns the session, the data channels
/// beyond the main one, and post-copy's request and answer connections.
#[allow(clippy::type_complexity)]
pub(super) fn accept_and_join<C: Connection>(
    rd: &mut WireReader<&mut C>,
    header: &Header,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<
    (
        [u8; SESSION_LEN],
        Vec<WireReader<BoxConn>>,
        Vec<WireReader<BoxConn>>,
    ),
    MigrateError,
> {
    let mut session = [0u8; SESSION_LEN];
    SystemRandom::new()
        .fill(&mut session)
        .map_err(|_| MigrateError::Setup("no random numbers for a session id".into()))?;
    {
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::ACCEPT, &session)?;
        w.flush()?;
    }
    if header.postcopy && header.verify_full {
        return Err(MigrateError::Malformed {
            record: "HEADER",
            at_byte: 10,
            why: "post-copy with verify-full (the byte comparison needs the memory the guest resumed from)".into(),
        });
    }
    let mut extras = if header.channels > 1 || header.postcopy {
        // Post-copy's request and answer connections join after the data
        // channels.
        let n = header.channels + if header.postcopy { 2 } else { 0 };
        join(&session, &(1..n).collect::<Vec<u16>>(), cfg.io_timeout)?
    } else {
        Vec::new()
    };
    // Post-copy's two connections are not data channels.
    let pc_conns = if header.postcopy {
        extras.split_off(extras.len().saturating_sub(2))
    } else {
        Vec::new()
    };
    Ok((session, extras, pc_conns))
}
