//! Admission under a flood of strangers: a real peer whose handshake is
//! under way when they arrive is not evicted by them.

use super::super::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A relay on a fresh local port to `to`, for one client: its bytes go on
/// at once, the server's only once `release` is set (the handshake is
/// held half way, its hello sent and no answer yet).
fn held_relay(to: SocketAddr, release: Arc<AtomicBool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    thread::spawn(move || {
        let (mut client, _) = l.accept().unwrap();
        let mut server = TcpStream::connect(to).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut s2);
            let _ = s2.shutdown(std::net::Shutdown::Write);
        });
        while !release.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        let _ = std::io::copy(&mut server, &mut client);
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    at
}

/// Calls `adm.next` until `until` holds of what it returned (or of the
/// admission), at most 30 s; returns the results seen.
fn drive(
    adm: &mut Admission<u8>,
    l: &dyn Listener,
    mut until: impl FnMut(&Admission<u8>, &[Admitted<u8>]) -> bool,
) -> Vec<Admitted<u8>> {
    let end = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !until(adm, &seen) {
        assert!(Instant::now() < end, "not reached in 30 s");
        let step = Some(Instant::now() + Duration::from_millis(20));
        if let Some(a) = adm.next(l, step).unwrap() {
            seen.push(a);
        }
    }
    seen
}

#[test]
fn strangers_arriving_during_a_real_handshake_do_not_evict_it() {
    let net = NetConfig {
        io_timeout: Duration::from_secs(20),
        security: psk(b"a key of sixteen bytes or more").unwrap(),
    };
    let l = bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = l.local().parse().unwrap();
    // The opening: one byte after the handshake.
    let open: Arc<Opener<u8>> = Arc::new(|mut c: BoxConn| {
        let mut b = [0u8; 1];
        c.read_exact(&mut b)
            .map_err(|e| MigrateError::io("the opening", &e))?;
        Ok(b[0])
    });
    let mut adm = Admission::new(&net, open);
    let release = Arc::new(AtomicBool::new(false));
    let relay = held_relay(addr, release.clone());
    let cnet = net.clone();
    let real = thread::spawn(move || {
        let mut c = client(TcpStream::connect(relay).unwrap(), &cnet)?;
        c.write_all(b"R")
            .map_err(|e| MigrateError::io("the opening", &e))?;
        c.flush().map_err(|e| MigrateError::io("the opening", &e))
    });
    // The real peer is in its handshake and has sent its hello.
    drive(&mut adm, &*l, |a, _| a.heard() == 1);
    // Twice the budget of strangers connect and send nothing.
    let strangers: Vec<TcpStream> = (0..2 * MAX_PREAUTH)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    drive(&mut adm, &*l, |a, _| {
        a.evicted() >= (MAX_PREAUTH + 1) as u64 && a.heard() == 1
    });
    // Its handshake goes on and it opens.
    release.store(true, Ordering::SeqCst);
    let seen = drive(&mut adm, &*l, |_, seen| {
        seen.iter().any(|(_, r)| matches!(r, Ok(b'R')))
    });
    real.join().unwrap().unwrap();
    assert!(seen.iter().filter(|(_, r)| r.is_ok()).count() == 1);
    drop(strangers);
}
