//! Opening a session: ACCEPT with a fresh session id, then the further
//! channels (and post-copy's two connections) joining it.

use super::DestConfig;
use crate::migrate::error::MigrateError;
use crate::migrate::net::{self, BoxConn, Conn, NetConfig};
use crate::migrate::wire::{tag, Header, Opening, WireReader, WireWriter, SESSION_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Accepts connections joining a session: the channel numbers wanted, in
/// that order, waiting at most the given time.
pub(crate) type Join<'a> = dyn FnMut(&[u8; SESSION_LEN], &[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError>
    + 'a;

/// Connections authenticating at once while channels join; one more is
/// refused at once, so strangers cannot hold unbounded threads.
pub const MAX_OPENING: usize = 16;

/// An accepted connection after its authentication and opening record,
/// or why it was refused.
type Opened = (SocketAddr, Result<(WireReader<BoxConn>, Opening), String>);

/// Authenticates `s` and reads its opening (each step bounded by the I/O
/// deadline), on a thread of its own.
fn open_peer(s: TcpStream, peer: SocketAddr, net: &NetConfig) -> Opened {
    let r = match net::server(s, net) {
        Err(e) => Err(format!(
            "a connection from {peer} failed authentication: {e}"
        )),
        Ok(conn) => WireReader::open(conn).map_err(|e| format!("{peer} authenticated, then: {e}")),
    };
    (peer, r)
}

/// The connections refused so far.
#[derive(Default)]
struct Refusals {
    count: u64,
    last: String,
}

impl Refusals {
    fn note(&mut self, why: String, refused: &mut dyn FnMut(&str)) {
        eprintln!("destination: refused a connection while joining channels: {why}");
        refused(&why);
        self.count += 1;
        self.last = why;
    }
}

/// Which of `wanted` an opened connection fills (not filled yet, of
/// `session`), or why it is refused.
fn place(
    (peer, opened): Opened,
    session: &[u8; SESSION_LEN],
    wanted: &[u16],
    got: &[Option<WireReader<BoxConn>>],
) -> Result<(usize, WireReader<BoxConn>), String> {
    match opened? {
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
/// authenticates on a thread of its own (at most [`MAX_OPENING`] at
/// once), so a peer that stalls cannot hold the source's back. Others are
/// refused (dropped, each named to `refused`: a failed authentication,
/// another session's id, garbage, a stall past the I/O deadline) and the
/// wait goes on; it ends after `wait`. Returns them in `wanted`'s order.
///
/// # Errors
/// [`MigrateError::JoinRefused`] when the wait passed after connections
/// were refused (it names the last), [`MigrateError::Timeout`] when it
/// passed with none at all, [`MigrateError::Io`] when accepting failed.
pub(super) fn join_channels(
    listener: &TcpListener,
    net: &NetConfig,
    wait: Duration,
    session: &[u8; SESSION_LEN],
    wanted: &[u16],
    refused: &mut dyn FnMut(&str),
) -> Result<Vec<WireReader<BoxConn>>, MigrateError> {
    let mut got: Vec<Option<WireReader<BoxConn>>> = wanted.iter().map(|_| None).collect();
    let deadline = Instant::now() + wait;
    let (tx, rx) = mpsc::channel::<Opened>();
    let (mut opening, mut no) = (0usize, Refusals::default());
    let io = |e: &std::io::Error| MigrateError::io("accepting the source's channels", e);
    listener.set_nonblocking(true).map_err(|e| io(&e))?;
    let r = loop {
        if got.iter().all(Option::is_some) {
            break Ok(());
        }
        match listener.accept() {
            Ok((s, peer)) if opening < MAX_OPENING && s.set_nonblocking(false).is_ok() => {
                let (tx, net) = (tx.clone(), net.clone());
                let t = std::thread::Builder::new()
                    .name("join-channel".into())
                    .spawn(move || drop(tx.send(open_peer(s, peer, &net))));
                match t {
                    Ok(_) => opening += 1,
                    Err(e) => no.note(
                        format!("{peer}: no thread to authenticate it: {e}"),
                        refused,
                    ),
                }
                continue;
            }
            Ok((_, peer)) if opening >= MAX_OPENING => no.note(
                format!("{peer}: {MAX_OPENING} connections authenticating already"),
                refused,
            ),
            Ok((_, peer)) => no.note(format!("{peer}: its socket cannot block"), refused),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break Err(io(&e)),
        }
        match rx.recv_timeout(Duration::from_millis(1)) {
            Ok(opened) => {
                opening -= 1;
                match place(opened, session, wanted, &got) {
                    Ok((k, rd)) => got[k] = Some(rd),
                    Err(why) => no.note(why, refused),
                }
            }
            Err(_) if Instant::now() < deadline => {}
            Err(_) if no.count == 0 => {
                break Err(MigrateError::Timeout {
                    what: "waiting for the source's further channels".into(),
                })
            }
            Err(_) => {
                break Err(MigrateError::JoinRefused {
                    wait,
                    refused: no.count,
                    last: std::mem::take(&mut no.last),
                })
            }
        }
    };
    let _ = listener.set_nonblocking(false);
    r.map(|()| got.into_iter().flatten().collect())
}

/// Accepts the stream (ACCEPT with a fresh session id) and waits for the
/// further channels to join it; returns the session, the data channels
/// beyond the main one, and post-copy's request and answer connections.
#[allow(clippy::type_complexity)]
pub(super) fn accept_and_join<C: Conn>(
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
