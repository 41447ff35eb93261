//! Admission: the connections a listener accepts, authenticated
//! concurrently, with strangers kept from the capacity a real peer needs.
//!
//! Every accepted connection runs its handshake (TLS, the key's proof)
//! and its opening on a thread of its own, within overall deadlines, so
//! no peer waits for another's. Two budgets:
//! - [`MAX_PREAUTH`] connections that have not authenticated yet. One more
//!   evicts the oldest of them that has sent nothing yet (its socket is
//!   shut down); where all have sent something, the oldest of those that
//!   have been at it for longer than [`PREAUTH_PROTECTED`]; where none has,
//!   the newcomer is refused. A real peer sends its opening (its TLS hello)
//!   as soon as it connects and authenticates within milliseconds: a flood
//!   of idle strangers cannot evict it at all, and strangers that send a
//!   byte and stall cannot evict it while its handshake runs. Nothing a
//!   stranger does here is an attempt of the migration.
//! - [`MAX_OPENING`] authenticated connections reading their opening
//!   record. Only peers holding the credentials reach it; one more is
//!   refused at once.
//!
//! With plain TCP there is no authentication: a connection leaves the
//! first budget when its opening record (magic, version, HEADER or JOIN)
//! has been read and checked.

use super::config::{NetConfig, Security};
use super::conn::{connection_via, transient, BoxConn, Connection, Listener, ShutdownHandle};
use super::secure::server;
use crate::stream_error::MigrateError;
use std::collections::VecDeque;
use std::io::{IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections in their handshake at once; one more evicts the oldest.
pub const MAX_PREAUTH: usize = 64;
/// Authenticated connections reading their opening at once; one more is
/// refused.
pub const MAX_OPENING: usize = 16;
/// How long a connection in its handshake that has sent something is kept
/// from eviction: a real peer's handshake (a few round trips) ends well
/// within it.
pub const PREAUTH_PROTECTED: Duration = Duration::from_secs(1);

/// What a connection's thread does after the handshake: reads and checks
/// its opening.
pub type Opener<T> = dyn Fn(BoxConn) -> Result<T, MigrateError> + Send + Sync;

/// Why a connection was refused, and whether it had authenticated first
/// (plain TCP: whether its opening had been read).
#[derive(Debug)]
pub struct Refused {
    /// It proved its identity before it failed.
    pub authenticated: bool,
    /// What failed.
    pub error: MigrateError,
}

/// A connection that authenticated and opened, or why it was refused.
/// The peer is named as the listener describes it.
pub type Admitted<T> = (String, Result<T, Refused>);

#[derive(Default)]
struct Pool {
    next_id: u64,
    /// Not authenticated yet, oldest first.
    preauth: VecDeque<Preauth>,
    /// Authenticated, reading their opening.
    opening: usize,
    /// Evicted so far.
    evicted: u64,
}

/// A connection in its handshake.
struct Preauth {
    id: u64,
    /// To end it on eviction.
    handle: ShutdownHandle,
    /// Set by its first read that returned bytes.
    heard: Arc<AtomicBool>,
    since: Instant,
}

impl Pool {
    /// Makes room for one more connection in the handshake budget (see
    /// the module's documentation); false when the newcomer must be
    /// refused instead.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.preauth.len() < MAX_PREAUTH {
            return true;
        }
        let silent = self
            .preauth
            .iter()
            .position(|c| !c.heard.load(Ordering::Acquire));
        let stale = || {
            self.preauth
                .iter()
                .position(|c| now.saturating_duration_since(c.since) > PREAUTH_PROTECTED)
        };
        match silent.or_else(stale).and_then(|i| self.preauth.remove(i)) {
            Some(c) => {
                c.handle.shutdown();
                self.evicted += 1;
                true
            }
            None => false,
        }
    }

    fn lock(p: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
        p.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves the pre-authentication budget for the opening one.
    fn authenticated(&mut self, id: u64) -> Result<(), MigrateError> {
        self.preauth.retain(|c| c.id != id);
        if self.opening >= MAX_OPENING {
            return Err(MigrateError::Setup(format!(
                "{MAX_OPENING} authenticated connections are reading their opening already"
            )));
        }
        self.opening += 1;
        Ok(())
    }
}

/// Accepts and admits the connections of one listener (see the module's
/// documentation). Dropping it leaves the threads still running to end at
/// their own deadlines; their results are dropped.
pub struct Admission<T> {
    net: NetConfig,
    open: Arc<Opener<T>>,
    pool: Arc<Mutex<Pool>>,
    tx: mpsc::Sender<Admitted<T>>,
    rx: mpsc::Receiver<Admitted<T>>,
}

impl<T: Send + 'static> Admission<T> {
    /// Admission with the security of `net`; `open` reads a connection's
    /// opening once it authenticated.
    pub fn new(net: &NetConfig, open: Arc<Opener<T>>) -> Self {
        let (tx, rx) = mpsc::channel();
        Admission {
            net: net.clone(),
            open,
            pool: Arc::new(Mutex::new(Pool::default())),
            tx,
            rx,
        }
    }

    /// Connections in their handshake that have sent something.
    #[cfg(test)]
    pub(super) fn heard(&self) -> usize {
        let p = Pool::lock(&self.pool);
        p.preauth
            .iter()
            .filter(|c| c.heard.load(Ordering::Acquire))
            .count()
    }

    /// Strangers evicted so far to make room for newer connections.
    pub fn evicted(&self) -> u64 {
        Pool::lock(&self.pool).evicted
    }

    /// Accepts what `listener` has and returns the next connection that
    /// authenticated and opened, or the next refused one (a failed or
    /// stalled handshake, an evicted stranger, a bad opening); None once
    /// `deadline` passed (None: wait for ever).
    ///
    /// # Errors
    /// [`MigrateError::Io`] when the listener fails.
    pub fn next(
        &mut self,
        listener: &dyn Listener,
        deadline: Option<Instant>,
    ) -> Result<Option<Admitted<T>>, MigrateError> {
        let io = |e: &std::io::Error| MigrateError::io("accepting connections", e);
        loop {
            // Only a connection already waiting: results are looked at
            // between accepts.
            let accepted = match listener.accept_until(Some(Instant::now())) {
                Ok(None) => false,
                Ok(Some((s, peer))) => {
                    if let Err(error) = self.admit(s, peer.clone()) {
                        let authenticated = false;
                        return Ok(Some((
                            peer,
                            Err(Refused {
                                authenticated,
                                error,
                            }),
                        )));
                    }
                    true
                }
                Err(e) if transient(&e) => false,
                Err(e) => return Err(io(&e)),
            };
            // Results first, even while a flood keeps the listener busy.
            if let Ok(a) = self.rx.try_recv() {
                return Ok(Some(a));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            if !accepted {
                if let Ok(a) = self.rx.recv_timeout(Duration::from_millis(1)) {
                    return Ok(Some(a));
                }
            }
        }
    }

    /// Starts the thread of an accepted connection, evicting the oldest
    /// stranger when the pre-authentication budget is full.
    fn admit(&mut self, s: BoxConn, peer: String) -> Result<(), MigrateError> {
        let io = |e: std::io::Error| MigrateError::io(format!("admitting {peer}"), &e);
        let handle = s.shutdown_handle().map_err(io)?;
        let heard = Arc::new(AtomicBool::new(false));
        let s = Heard {
            conn: s,
            heard: heard.clone(),
        };
        let id = {
            let mut p = Pool::lock(&self.pool);
            let now = Instant::now();
            if !p.make_room(now) {
                handle.shutdown();
                return Err(MigrateError::Setup(format!(
                    "{MAX_PREAUTH} connections are in their handshake, each sending and none \
                     for longer than {PREAUTH_PROTECTED:?}: {peer} refused"
                )));
            }
            let id = p.next_id;
            p.next_id += 1;
            p.preauth.push_back(Preauth {
                id,
                handle,
                heard,
                since: now,
            });
            id
        };
        let (tx, net, open, pool) = (
            self.tx.clone(),
            self.net.clone(),
            self.open.clone(),
            self.pool.clone(),
        );
        let who = peer.clone();
        let t = std::thread::Builder::new()
            .name("admit".into())
            .spawn(move || {
                let r = authenticate_and_open(s, id, &net, &*open, &pool);
                drop(tx.send((who, r)));
            });
        t.map(|_| ()).map_err(|e| {
            Pool::lock(&self.pool).preauth.retain(|c| c.id != id);
            MigrateError::Setup(format!("{peer}: no thread to authenticate it: {e}"))
        })
    }
}

/// A connection's thread: the handshake, then the opening; the budgets
/// kept as the module says.
fn authenticate_and_open<T>(
    s: Heard,
    id: u64,
    net: &NetConfig,
    open: &Opener<T>,
    pool: &Mutex<Pool>,
) -> Result<T, Refused> {
    let plain = matches!(net.security, Security::Plain);
    let pre = |error| Refused {
        authenticated: false,
        error,
    };
    let r = server(s, net).map_err(pre).and_then(|conn| {
        if plain {
            // Plain TCP: the opening is the only check there is.
            return open(conn).map_err(pre);
        }
        Pool::lock(pool)
            .authenticated(id)
            .map_err(|error| Refused {
                authenticated: true,
                error,
            })?;
        let r = open(conn);
        Pool::lock(pool).opening -= 1;
        r.map_err(|error| Refused {
            authenticated: true,
            error,
        })
    });
    Pool::lock(pool).preauth.retain(|c| c.id != id);
    r
}

/// An accepted connection that notes its first read that returned bytes
/// (the pool's "heard from"); otherwise the connection itself.
struct Heard {
    conn: BoxConn,
    heard: Arc<AtomicBool>,
}

impl Heard {
    fn note(&self, n: usize) {
        if n > 0 && !self.heard.load(Ordering::Relaxed) {
            self.heard.store(true, Ordering::Release);
        }
    }
}

impl Read for Heard {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.conn.read(buf)?;
        self.note(n);
        Ok(n)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        let n = self.conn.read_vectored(bufs)?;
        self.note(n);
        Ok(n)
    }
}

impl Write for Heard {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.conn.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.conn.write_vectored(bufs)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.conn.flush()
    }
}

impl Connection for Heard {
    connection_via!(conn, all);
}
