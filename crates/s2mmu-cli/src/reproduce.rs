//! `s2mmu reproduce`: runs every seed's experiment with both policies side
//! by side and writes a report that puts the published figures next to the
//! ones measured on this machine.

use crate::report::{host, Report};
use clap::Parser;
use serde_json::json;
use std::fmt::Write as _;
use std::time::Instant;

/// Options of `reproduce`.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// Where to write the Markdown report.
    #[arg(long, default_value = "s2mmu-reproduce.md")]
    pub out: String,
    /// Smaller sizes, for a quick look (about a third of the time).
    #[arg(long)]
    pub quick: bool,
    /// Skip the runs on the host's real KVM.
    #[arg(long)]
    pub no_kvm: bool,
    /// Print one JSON object (every experiment's envelope) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Parses a subcommand's options from words, as a user would type them.
fn parse<T: clap::Args>(words: &[&str]) -> Result<T, String> {
    #[derive(Parser)]
    struct Wrap<U: clap::Args> {
        #[command(flatten)]
        inner: U,
    }
    let mut argv = vec!["s2mmu"];
    argv.extend_from_slice(words);
    Wrap::<T>::try_parse_from(argv)
        .map(|w| w.inner)
        .map_err(|e| e.to_string())
}

/// One experiment: its seed, the published figures, the command run here.
struct Experiment {
    seed: &'static str,
    title: &'static str,
    published: &'static str,
    command: String,
    run: Box<dyn Fn() -> Result<Report, String>>,
}

fn experiments(p: &Params) -> Vec<Experiment> {
    let q = p.quick;
    let mut v = Vec::new();
    let split_args: Vec<String> = if q {
        vec!["--runs".into(), "3".into()]
    } else {
        vec!["--runs".into(), "7".into()]
    };
    v.push(Experiment {
        seed: "000",
        title: "Optimize S2 page splitting: the RFC's skip returns (v1) and the skip-level walker flag (v2) vs the full walk, on eager split and on CLEAR (split-perf)",
        published: "v1, skip returns (RFC 2026-05-15, FVP model, 1 GiB VM, whole-slot split): already 4K -97.33 % runtime; THP -19.82 %; 1x1G hugetlb -20.65 %. \
                    v2, the skip-level walker flag KVM_PGTABLE_WALK_SKIP_LEVEL3 that replaced them, as posted 2026-06-10 (AmpereOne, 64 GB slot): \
                    enabling logging -35.47 % / -11.94 % / -14.46 % (already 4K / THP / 64x1G hugetlb); CLEAR_DIRTY_LOG with manual protect -26.36 % / -12.05 % / -13.87 %. \
                    Issue 17 quotes v2 on a 16 GB slot: enabling logging -44 % / -24.7 % / -24.8 %, CLEAR_DIRTY_LOG -39 % / -25.5 %, and the author finding that skipping children \
                    'was marginally slower than just skipping levels' (the mail with these figures was not found here; the v2 posting of 2026-06-18 that was found carries no figures). \
                    All are against the full walk; the v1 and v2 figures come from different machines and slot sizes.",
        command: format!("s2mmu split-perf {}", split_args.join(" ")),
        run: Box::new(move || {
            let words: Vec<&str> = split_args.iter().map(String::as_str).collect();
            let sp: crate::split_perf::Params = parse(&words)?;
            crate::split_perf::run(&sp, false)
        }),
    });
    let mut slots: Vec<&'static str> = if q {
        vec![
            "-s",
            "10,509,32764",
            "-r",
            "1",
            "-l",
            "0.2",
            "--lookups",
            "200000",
        ]
    } else {
        vec!["-s", "10,30,50,100,509,32764", "-r", "3", "-l", "0.5"]
    };
    if !p.no_kvm {
        slots.push("--kvm");
    }
    v.push(Experiment {
        seed: "001",
        title: "Scalable memslots: tree sets against the copied array (memslot-perf)",
        published: "Xeon 8167M, memslot_perf_test, TDP MMU off. 32k slots: slot setup 16.1 s -> 0.59 s (96 %), move active 0.00142 s -> 0.0000786 s (94 %), \
                    unmap 3.88 s -> 0.0351 s (99 %); 509 slots: setup 41 %, unmap 56 % less; 10 slots: setup 17 %, move 14-16 % less, map/unmap about equal.",
        command: format!("s2mmu memslot-perf {}", slots.join(" ")),
        run: Box::new(move || crate::memslot_perf::run_report(&parse(&slots)?)),
    });
    let both: Vec<&'static str> = if q {
        vec![
            "--policy",
            "both",
            "-v",
            "1,2,4,8",
            "-b",
            "32M",
            "-s",
            "anonymous_thp",
            "-e",
        ]
    } else {
        vec![
            "--policy",
            "both",
            "-v",
            "1,2,4,8,16",
            "-b",
            "128M",
            "-s",
            "anonymous_thp",
            "-e",
        ]
    };
    v.push(Experiment {
        seed: "002",
        title: "Read-lock fast path for permission relaxation vs write-lock faults (dirty-log-perf --policy both)",
        published: "Ampere Altra, dirty_log_perf_test -b 2G -i 2 -s anonymous_hugetlb_2mb. Before (write lock): dirty memory time 926 / 1189 / 2503 / 5069 / 10340 ms \
                    for 1 / 2 / 4 / 8 / 16 vCPUs, contentions 0 / 4.7M / 11.5M / 24.9M / 50.3M. After (read lock): 803 / 843 / 942 / 1458 / 2853 ms (more than 60 % less from 4 vCPUs on).",
        command: format!("s2mmu dirty-log-perf {}", both.join(" ")),
        run: Box::new(move || crate::dirty_log_perf::run(&parse(&both)?)),
    });
    let tlb: Vec<&'static str> = if q {
        // The seed's 64 GiB even here: a smaller slot needs fewer than 8 range calls
        // and so cannot show the target. Mapping it takes well under a second.
        vec!["--runs", "5"]
    } else {
        vec!["--runs", "11"]
    };
    v.push(Experiment {
        seed: "003",
        title: "One whole-VMID flush instead of split range calls for large dirty-log clears (tlb-perf)",
        published: "RFC 2026-02 (yezhenyu, Huawei), live migration: kvm_arch_flush_remote_tlbs_range 9.67 % of ram_find_and_save_block -> 0.03 %; \
                    kvm_clear_dirty_log_protect 26.74 % -> 1.75 %; migration bandwidth <10 GB/s -> ~50 GB/s. Unmerged; no reproducer was given.",
        command: format!("s2mmu tlb-perf {}", tlb.join(" ")),
        run: Box::new(move || crate::tlb_perf::run(&parse(&tlb)?, false)),
    });
    let eager: Vec<&'static str> = if q {
        vec!["-e", "-s", "anonymous_thp", "-v", "2", "-b", "256M"]
    } else {
        vec!["-e", "-s", "anonymous_thp", "-v", "2", "-b", "512M"]
    };
    v.push(Experiment {
        seed: "004",
        title: "Eager page splitting when dirty logging is enabled vs split on fault (dirty-log-perf -e)",
        published: "x86 TDP MMU, 96 vCPUs x 1 GiB, 1 GiB hugetlb: time for vCPUs to dirty their memory after enabling logging 2.94 s -> 0.14 s (-95 %); \
                    CPU time splitting ~270 CPU-s -> 1.55 CPU-s; enabling logging 0.001 s -> 1.55 s.",
        command: format!("s2mmu dirty-log-perf {}", eager.join(" ")),
        run: Box::new(move || crate::dirty_log_perf::run(&parse(&eager)?)),
    });
    // Issue 16: the dirty tracking modes side by side, on both formats.
    for format in ["arm64", "ept"] {
        let modes: Vec<&'static str> = vec![
            "--dirty",
            "all",
            "--format",
            format,
            "-v",
            "1",
            "-b",
            "256M",
            "-i",
            "4",
            "-r",
            if q { "1" } else { "3" },
        ];
        v.push(Experiment {
            seed: "16",
            title: "Write protection against hardware dirty state and PML (dirty-log-perf --dirty all)",
            published: "No published head-to-head on one workload (issue 16). Keqian Zhu's arm64 DBM RFC measured a harvest of about 40 ms per 64 GiB.                         Targets: 1 vCPU, 256 MiB, hardware dirty mode with 0 write faults per pass and dirty memory time within 1.5x of a pass with logging off.",
            command: format!("s2mmu dirty-log-perf {}", modes.join(" ")),
            run: Box::new(move || crate::dirty_log_perf::run(&parse(&modes)?)),
        });
    }
    if !p.no_kvm {
        let cmp: Vec<&'static str> = vec!["--compare", "-b", if q { "64M" } else { "256M" }];
        v.push(Experiment {
            seed: "kvm",
            title: "The engine against the host's real KVM (dirty-log-perf --compare)",
            published: "Reference: one write-protection fault on real KVM costs an exit, a shadow-MMU fault and a re-entry (a few microseconds on these machines).",
            command: format!("s2mmu dirty-log-perf {}", cmp.join(" ")),
            run: Box::new(move || crate::dirty_log_perf::run(&parse(&cmp)?)),
        });
    }
    v
}

/// Runs `reproduce` from the command line.
///
/// # Errors
/// A message naming the experiment that failed; the others still run and
/// the report says which failed.
pub fn main(p: Params) -> Result<(), String> {
    let mut md = String::new();
    let h = host();
    let _ = writeln!(md, "# s2mmu: the seeds reproduced\n");
    let _ = writeln!(
        md,
        "Host: {} logical CPUs, kernel {}, CPU {}, s2mmu {} ({}), {} build.\n",
        h["logical_cpus"],
        h["kernel_release"].as_str().unwrap_or("?"),
        h["cpu_model"].as_str().unwrap_or("?"),
        h["engine_version"].as_str().unwrap_or("?"),
        h["git_revision"].as_str().unwrap_or("no git revision"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for e in experiments(&p) {
        if !p.json {
            eprintln!("reproduce: seed {}: {} ...", e.seed, e.command);
        }
        let t0 = Instant::now();
        let _ = writeln!(md, "## Seed {}: {}\n", e.seed, e.title);
        let _ = writeln!(md, "Published: {}\n", e.published);
        let _ = writeln!(md, "Measured here with `{}`:\n", e.command);
        match (e.run)() {
            Ok(r) => {
                let _ = writeln!(md, "```text\n{}```\n", r.text());
                all.push(json!({"seed": e.seed, "command": e.command, "report": r.to_json()}));
            }
            Err(err) => {
                let _ = writeln!(md, "FAILED: {err}\n");
                failed.push(format!("seed {}: {err}", e.seed));
                all.push(json!({"seed": e.seed, "command": e.command, "error": err}));
            }
        }
        let _ = writeln!(md, "({:.1} s)\n", t0.elapsed().as_secs_f64());
    }
    std::fs::write(&p.out, &md).map_err(|e| format!("cannot write {}: {e}", p.out))?;
    if p.json {
        let mut r = Report::new(
            "reproduce",
            json!({"out": p.out, "quick": p.quick, "no_kvm": p.no_kvm}),
        );
        for x in &all {
            r.result(x["seed"].as_str().unwrap_or("?"), "both", x.clone());
        }
        crate::report::emit(&r, true);
    } else {
        print!("{md}");
        eprintln!("reproduce: report written to {}", p.out);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} experiment(s) failed: {}",
            failed.len(),
            failed.join("; ")
        ))
    }
}
