//! AES-GCM seal and open of 16 KiB TLS records (the record layer's unit),
//! ring against aws-lc-rs, one thread: CPU ns per 4 KiB page of plaintext.
/// This thread's CPU time in ns (the machine is shared: wall time is not).
fn cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

const REC: usize = 16 << 10;
const N: usize = 20_000; // 320 MiB a pass

macro_rules! bench {
    ($name:expr, $m:ident, $alg:expr) => {{
        use $m::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
        let key = LessSafeKey::new(UnboundKey::new($alg, &[7u8; 32][..$alg.key_len()]).unwrap());
        let mut buf = vec![0x5au8; REC];
        let t = cpu_ns();
        let mut tags = 0u8;
        for i in 0..N {
            let mut n = [0u8; 12];
            n[4..].copy_from_slice(&(i as u64).to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(n), Aad::from([0x17u8, 3, 3, 0, 0]), &mut buf)
                .unwrap();
            tags ^= tag.as_ref()[0];
        }
        let seal = (cpu_ns() - t) as f64 / (N * REC / 4096) as f64;
        // Open: one sealed record, opened N times (a fresh copy each time).
        let mut rec = vec![0x5au8; REC];
        let n0 = Nonce::assume_unique_for_key([0u8; 12]);
        key.seal_in_place_append_tag(n0, Aad::from([0u8; 5]), &mut rec).unwrap();
        let mut work = rec.clone();
        let t = cpu_ns();
        for _ in 0..N {
            work.copy_from_slice(&rec);
            let n0 = Nonce::assume_unique_for_key([0u8; 12]);
            key.open_in_place(n0, Aad::from([0u8; 5]), &mut work).unwrap();
        }
        let open = (cpu_ns() - t) as f64 / (N * REC / 4096) as f64;
        println!("{:<28} seal {:>6.0} ns/page  open {:>6.0} ns/page (incl. a 16 KiB copy)  [{}]", $name, seal, open, tags);
    }};
}

fn main() {
    for _ in 0..3 {
        bench!("ring AES-128-GCM", ring, &ring::aead::AES_128_GCM);
        bench!("aws-lc-rs AES-128-GCM", aws_lc_rs, &aws_lc_rs::aead::AES_128_GCM);
        bench!("ring AES-256-GCM", ring, &ring::aead::AES_256_GCM);
        bench!("aws-lc-rs AES-256-GCM", aws_lc_rs, &aws_lc_rs::aead::AES_256_GCM);
    }
}
