//! Opening a session: ACCEPT with a fresh session id, then the further
//! channels (and post-copy's two connections) joining it.

use super::DestConfig;
use crate::migrate::error::MigrateError;
use crate::migrate::net::{self, BoxConn, Conn, NetConfig};
use crate::migrate::wire::{tag, Header, Opening, WireReader, WireWriter, SESSION_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Accepts connections joining a session: the channel numbers wanted, in
/// that order, waiting at most the given time.
pub(crate) type Join<'a> = dyn FnMut(&[u8; SESSION_LEN], &[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError>
    + 'a;

/// Accepts the source's connections that join `session` with the channel
/// numbers `wanted` (its further channels; post-copy's recovery): each
/// must authenticate and join with a wanted number not seen yet. Others
/// are refused (dropped, each named to `refused`: a failed
/// authentication, another session's id, garbage, a stall past the I/O
/// deadline) and the wait goes on; it ends after `wait`. Returns them in
/// `wanted`'s order.
///
/// # Errors
/// [`MigrateError::JoinRefused`] when the wait passed after connections
/// were refused (it names the last), [`MigrateError::Io`] when it passed
/// with none at all.
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
    let (mut count, mut last) = (0u64, String::new());
    while got.iter().any(Option::is_none) {
        let (s, peer) = match net::accept_until(listener, Some(deadline)) {
            Ok(x) => x,
            Err(e) if count == 0 => return Err(e),
            Err(_) => {
                return Err(MigrateError::JoinRefused {
                    wait,
                    refused: count,
                    last,
                })
            }
        };
        let why = match net::server(s, net) {
            Err(e) => format!("a connection from {peer} failed authentication: {e}"),
            Ok(conn) => match WireReader::open(conn) {
                Ok((
                    rd,
                    Opening::Join {
                        session: s,
                        channel,
                    },
                )) if &s == session => match wanted.iter().position(|&c| c == channel) {
                    Some(k) if got[k].is_none() => {
                        got[k] = Some(rd);
                        continue;
                    }
                    Some(_) => format!("{peer} joined channel {channel} a second time"),
                    None => format!("{peer} joined channel {channel}, not one awaited"),
                },
                Ok((_, Opening::Join { .. })) => format!(
                    "{peer} authenticated but joined another session (not this migration's)"
                ),
                Ok(_) => format!("{peer} opened a new migration, not a channel of this one"),
                Err(e) => format!("{peer} authenticated, then: {e}"),
            },
        };
        eprintln!("destination: refused a connection while joining channels: {why}");
        refused(&why);
        count += 1;
        last = why;
    }
    Ok(got.into_iter().flatten().collect())
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
