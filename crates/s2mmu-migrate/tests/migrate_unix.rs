//! The Unix-socket transport (same-host upgrades): real migrations of a
//! small guest over a Unix socket, plain, with mutual TLS and with a
//! pre-shared key layered over it, and one over four channels. Behaviour
//! only: the memories are equal by digest, the (empty) probe and every page
//! arrived, the peer is named by its socket.

mod migrate_common;

use migrate_common::{dest_cfg, plain, small, tls};
use s2mmu_migrate::sim::dest::serve;
use s2mmu_migrate::sim::source::{migrate_source, SimRun};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self as net, Listener, NetConfig, UnixListen};
use s2mmu_migrate::wire::PAGE_SIZE;
use std::time::Duration;

/// A fresh socket path in the test's temporary directory.
fn socket_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("s2mmu-unix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("migrate.sock")
}

/// Migrates `cfg` over a Unix socket secured as `net`; checks the result.
fn migrate_over_unix(name: &str, cfg: &SimRun, net: &NetConfig) {
    let path = socket_path(name);
    let listener = UnixListen::bind(&path).unwrap();
    assert_eq!(listener.local(), format!("unix:{}", path.display()));
    let (dnet, dest) = (net.clone(), dest_cfg());
    let d = std::thread::spawn(move || serve(&listener, &dest, &dnet));
    let addr = format!("unix:{}", path.display());
    let s = migrate_source(cfg, &mut |_| {
        let c = net::connect(&addr, net)?;
        net::client(c, net)
    })
    .expect("the source over a Unix socket");
    let d = d
        .join()
        .unwrap()
        .expect("the destination over a Unix socket");
    assert_eq!(s.channels, cfg.session.channels);
    assert_eq!(d.channels, cfg.session.channels);
    assert_eq!(d.probe_bytes, 0, "no link probe unless asked for");
    assert_eq!(s.link_bytes, 0);
    assert_eq!(s.slot_digests, d.slot_digests, "per-slot digests agree");
    assert_eq!(s.rounds[0].pages, cfg.guest.mem_size / PAGE_SIZE as u64);
    assert!(d.resumed_at.is_some());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn plain_migration_over_a_unix_socket() {
    migrate_over_unix("plain", &small(16 << 20), &plain());
}

#[test]
fn mutual_tls_over_a_unix_socket() {
    let net = tls();
    migrate_over_unix(
        "tls",
        &small(16 << 20).with(|_, s| {
            s.channels = 4;
        }),
        &net,
    );
}

#[test]
fn pre_shared_key_over_a_unix_socket() {
    let net = NetConfig {
        io_timeout: Duration::from_secs(10),
        security: net::psk(b"0123456789abcdef-unix").unwrap(),
    };
    migrate_over_unix("psk", &small(16 << 20), &net);
}

#[test]
fn a_wrong_key_over_a_unix_socket_is_refused_before_any_page() {
    let path = socket_path("wrongkey");
    let listener = UnixListen::bind(&path).unwrap();
    let dnet = NetConfig {
        io_timeout: Duration::from_secs(5),
        security: net::psk(b"the destination's key").unwrap(),
    };
    let snet = NetConfig {
        io_timeout: Duration::from_secs(5),
        security: net::psk(b"another key, the source's").unwrap(),
    };
    let mut dest = dest_cfg();
    dest.dest.accept_wait = Some(Duration::from_secs(3));
    let d = std::thread::spawn(move || serve(&listener, &dest, &dnet));
    let addr = format!("unix:{}", path.display());
    let s = migrate_source(&small(8 << 20), &mut |_| {
        let c = net::connect(&addr, &snet)?;
        net::client(c, &snet)
    });
    assert!(
        matches!(s, Err(MigrateError::Auth { .. })),
        "the source sees the failed proof: {s:?}"
    );
    let d = d.join().unwrap();
    assert!(
        matches!(d, Err(MigrateError::Auth { .. })),
        "the destination refused the stranger and resumed nothing: {d:?}"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
