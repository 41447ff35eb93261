//! A TCP proxy that cuts a migration's connections for real: once armed,
//! it shuts every connection it forwards down (both ways, at the socket)
//! after `cut_after` more bytes (either way, all connections together).
//! Connections made after the cut are forwarded untouched (a recovery's
//! reconnect goes through), or with `refuse_after` closed at once (only a
//! recovery to another address goes through).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A running proxy.
pub struct CutProxy {
    /// Where the source connects.
    pub addr: String,
    /// Raised: bytes count towards the cut from now on.
    pub armed: Arc<AtomicBool>,
    /// Raised once the connections were shut down.
    pub cut_done: Arc<AtomicBool>,
}

/// What the forwarding threads share.
#[derive(Clone)]
struct ProxyState {
    armed: Arc<AtomicBool>,
    cut_done: Arc<AtomicBool>,
    counted: Arc<AtomicU64>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    cut_after: u64,
}

/// A proxy to `to` on a loopback port of its own.
pub fn start(to: String, cut_after: u64, refuse_after: bool) -> CutProxy {
    let l = TcpListener::bind("127.0.0.1:0").expect("the proxy's port");
    let addr = l.local_addr().unwrap().to_string();
    let sh = ProxyState {
        armed: Arc::default(),
        cut_done: Arc::default(),
        counted: Arc::default(),
        live: Arc::default(),
        cut_after,
    };
    let proxy = CutProxy {
        addr,
        armed: sh.armed.clone(),
        cut_done: sh.cut_done.clone(),
    };
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            if refuse_after && sh.cut_done.load(Ordering::SeqCst) {
                eprintln!("proxy: refusing a connection after the cut");
                continue;
            }
            let Ok(d) = TcpStream::connect(&to) else {
                continue;
            };
            let cuttable = !sh.cut_done.load(Ordering::SeqCst);
            if cuttable {
                let mut v = sh.live.lock().unwrap();
                v.push(s.try_clone().unwrap());
                v.push(d.try_clone().unwrap());
            }
            for (from, into) in [(s.try_clone().unwrap(), d.try_clone().unwrap()), (d, s)] {
                let sh = sh.clone();
                std::thread::spawn(move || forward(from, into, cuttable, &sh));
            }
        }
    });
    proxy
}

fn forward(mut from: TcpStream, mut into: TcpStream, cuttable: bool, sh: &ProxyState) {
    let mut buf = [0u8; 16384];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cuttable && sh.armed.load(Ordering::SeqCst) {
            let total = sh.counted.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
            if total >= sh.cut_after && !sh.cut_done.swap(true, Ordering::SeqCst) {
                eprintln!("proxy: cutting every connection after {total} bytes since armed");
                for s in sh.live.lock().unwrap().iter() {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
        if into.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = into.shutdown(Shutdown::Write);
}
