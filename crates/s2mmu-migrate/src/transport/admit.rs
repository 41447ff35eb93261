//! Admission: the connections a listener accepts, authenticated
//! concurrently, with strangers kept from the capacity a real peer needs.
//!
//! Every accepted connection runs its handshake (TLS, the key's proof)
//! and its opening on a thread of its own, within overall deadlines, so
//! no peer waits for another's. Two budgets:
//! - [`MAX_PREAUTH`] connections that have not authenticated yet. One more
//!   evicts the oldest of them (its socket is shut down): a flood of idle
//!   or slow strangers only ever pushes out strangers older than the
//!   newest, and a real peer, which authenticates within milliseconds of
//!   connecting, is out of this budget long before a flood can reach it.
//!   Nothing a stranger does here is an attempt of the migration.
//! - [`MAX_OPENING`] authenticated connections reading their opening
//!   record. Only peers holding the credentials reach it; one more is
//!   refused at once.
//!
//! With plain TCP there is no authentication: a connection leaves the
//! first budget when its opening record (magic, version, HEADER or JOIN)
//! has been read and checked.

use super::config::{NetConfig, Security};
use super::conn::{transient, BoxConn, Listener, ShutdownHandle};
use super::secure::server;
use crate::stream_error::MigrateError;
use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections in their handshake at once; one more evicts the oldest.
pub const MAX_PREAUTH: usize = 64;
/// Authenticated connections reading their opening at once; one more is
/// refused.
pub const MAX_OPENING: usize = 16;

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
    /// Not authenticated yet, oldest first (each one's shutdown handle,
    /// to end it on eviction).
    preauth: VecDeque<(u64, ShutdownHandle)>,
    /// Authenticated, reading their opening.
    opening: usize,
    /// Evicted so far.
    evicted: u64,
}

impl Pool {
    fn lock(p: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
        p.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves the pre-authentication budget for the opening one.
    fn authenticated(&mut self, id: u64) -> Result<(), MigrateError> {
        self.preauth.retain(|(i, _)| *i != id);
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
        let id = {
            let mut p = Pool::lock(&self.pool);
            if p.preauth.len() >= MAX_PREAUTH {
                if let Some((_, oldest)) = p.preauth.pop_front() {
                    oldest.shutdown();
                    p.evicted += 1;
                }
            }
            let id = p.next_id;
            p.next_id += 1;
            p.preauth.push_back((id, handle));
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
            Pool::lock(&self.pool).preauth.retain(|(i, _)| *i != id);
            MigrateError::Setup(format!("{peer}: no thread to authenticate it: {e}"))
        })
    }
}

/// A connection's thread: the handshake, then the opening; the budgets
/// kept as the module says.
fn authenticate_and_open<T>(
    s: BoxConn,
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
    Pool::lock(pool).preauth.retain(|(i, _)| *i != id);
    r
}
