//! Whether a migration's destination is on this host.

/// Whether `--to ADDR` names this host: a Unix socket, or a host that
/// resolves only to loopback addresses (a name that does not resolve is
/// not taken to be local: the connection reports that error itself).
pub(super) fn destination_is_local(to: &str) -> bool {
    use std::net::ToSocketAddrs;
    if to.starts_with("unix:") {
        return true;
    }
    match to.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::destination_is_local;

    #[test]
    fn loopback_and_unix_destinations_are_local_others_are_not() {
        assert!(destination_is_local("127.0.0.1:4444"));
        assert!(destination_is_local("[::1]:4444"));
        assert!(destination_is_local("unix:/tmp/s2mmu.sock"));
        assert!(!destination_is_local("10.77.0.2:4444"));
        assert!(!destination_is_local("192.0.2.1:4444"));
        assert!(!destination_is_local("not an address"));
    }
}
