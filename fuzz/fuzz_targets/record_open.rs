//! The TLS 1.3 record opener (`s2mmu_migrate::transport`'s record layer,
//! the code that turns the network's bytes into plaintext) against
//! hostile streams. Records are sealed with a fixed key from the fuzzer's
//! writes (so most get past the AEAD and reach the parsing behind it),
//! numbered from 0 or from just below the 2^24-record limit, then
//! damaged: bits flipped, length fields set at, under and over the
//! bounds, records swapped, repeated, dropped or cut, bytes inserted. The
//! opener may refuse a stream, but it must never panic, and every byte it
//! hands out must be the sent plaintext's (a prefix of it: no byte out of
//! order, none invented); an undamaged stream is read whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use s2mmu_migrate::transport::{
    fixed_key_session, Duplex, SharedSink, MAX_CIPHER, MAX_PLAIN, MAX_RECORDS,
};
use std::io::{IoSliceMut, Read, Write};

const KEY: [u8; 32] = [7; 32];
const IV: [u8; 12] = [9; 12];

/// Record boundaries of a well-formed stream: (start, end) of each.
fn records(s: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= s.len() {
        let end = at + 5 + usize::from(u16::from_be_bytes([s[at + 3], s[at + 4]]));
        out.push((at, end.min(s.len())));
        at = end;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let chacha = next() & 1 == 1;
    let first_seq = match next() % 4 {
        0 => MAX_RECORDS - 1 - u64::from(next() % 3),
        _ => 0,
    };
    // The writes: up to 6, each up to ~40 KiB (several records each).
    let mut plain = Vec::new();
    let out = SharedSink::default();
    let sock = Duplex {
        input: std::io::empty(),
        output: out.clone(),
    };
    let mut w = fixed_key_session(Box::new(sock), KEY, IV, chacha, first_seq).unwrap();
    let mut sealed_all = true;
    for _ in 0..next() % 7 {
        let len = usize::from(next()) * 160 + usize::from(next());
        let fill = next();
        let d: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
        match w.write_all(&d) {
            Ok(()) => plain.extend_from_slice(&d),
            Err(e) => {
                // Only the key's record limit stops the sealing.
                assert!(e.to_string().contains("record limit"), "{e}");
                assert!(first_seq > 0);
                sealed_all = false;
                break;
            }
        }
    }
    drop(w);
    let mut stream = out.bytes();
    // The damage: up to 4 operations.
    let mut damaged = false;
    for _ in 0..next() % 5 {
        let recs = records(&stream);
        let pick = |b: u8| recs.get(usize::from(b) % recs.len().max(1)).copied();
        match next() % 7 {
            0 if !stream.is_empty() => {
                let at = (usize::from(next()) << 8 | usize::from(next())) * 3 % stream.len();
                stream[at] ^= 1 << (next() % 8);
                damaged = true;
            }
            1 => {
                if let Some((s, _)) = pick(next()) {
                    let lens = [
                        0,
                        1,
                        16,
                        17,
                        MAX_PLAIN + 17,
                        MAX_PLAIN + 18,
                        MAX_CIPHER,
                        MAX_CIPHER + 1,
                        0xffff,
                    ];
                    let len = lens[usize::from(next()) % lens.len()];
                    let old = [stream[s + 3], stream[s + 4]];
                    stream[s + 3..s + 5].copy_from_slice(&(len as u16).to_be_bytes());
                    damaged |= old != [stream[s + 3], stream[s + 4]];
                }
            }
            2 => {
                if let (Some(a), Some(b)) = (pick(next()), pick(next())) {
                    if a.0 < b.0 {
                        let mut s = stream[..a.0].to_vec();
                        s.extend_from_slice(&stream[b.0..b.1]);
                        s.extend_from_slice(&stream[a.1..b.0]);
                        s.extend_from_slice(&stream[a.0..a.1]);
                        s.extend_from_slice(&stream[b.1..]);
                        damaged |= s != stream;
                        stream = s;
                    }
                }
            }
            3 => {
                if let Some((s, e)) = pick(next()) {
                    let r = stream[s..e].to_vec();
                    stream.splice(e..e, r);
                    damaged = true;
                }
            }
            4 => {
                if let Some((s, e)) = pick(next()) {
                    stream.drain(s..e);
                    damaged = true;
                }
            }
            5 if !stream.is_empty() => {
                let at = usize::from(next()) * 97 % stream.len();
                stream.truncate(at);
                damaged = true;
            }
            _ => {
                let at = usize::from(next()) * 97 % (stream.len() + 1);
                let junk: Vec<u8> = (0..next() % 24).map(|_| next()).collect();
                damaged |= !junk.is_empty();
                stream.splice(at..at, junk);
            }
        }
    }
    // Open it, in reads of the fuzzer's sizes (plain and vectored).
    let sock = Duplex {
        input: std::io::Cursor::new(stream),
        output: std::io::sink(),
    };
    let mut r = fixed_key_session(Box::new(sock), KEY, IV, chacha, first_seq).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 48 << 10];
    let end = loop {
        let n = 1 + usize::from(next()) * 190;
        let read = if next() & 1 == 0 {
            r.read(&mut buf[..n])
        } else {
            let (a, b) = buf[..n].split_at_mut(n / 2);
            r.read_vectored(&mut [IoSliceMut::new(a), IoSliceMut::new(b)])
        };
        match read {
            Ok(0) => break None,
            Ok(k) => {
                assert!(k <= n);
                got.extend_from_slice(&buf[..k]);
                assert!(got.len() <= plain.len(), "more bytes opened than sealed");
            }
            Err(e) => break Some(e),
        }
    };
    assert!(
        got[..] == plain[..got.len()],
        "opened bytes that were not sent"
    );
    if !damaged && sealed_all {
        assert!(got == plain, "an undamaged stream is read whole");
        let e = end.expect("no close_notify was sent: the end is an error");
        assert!(e.to_string().contains("close_notify"), "{e}");
    }
});
