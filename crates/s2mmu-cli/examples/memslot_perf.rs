//! Runs `memslot-perf` before the CLI has the subcommand:
//! `cargo run --release -p s2mmu-cli --example memslot_perf -- [-s 10,509] [-l SECONDS] [-r RUNS] [--json]`.

#[path = "../src/memslot_perf.rs"]
mod memslot_perf;

fn main() {
    let mut params = memslot_perf::MemslotPerfParams::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "-s" | "--slots" => {
                params.slots = value()
                    .split(',')
                    .map(|n| n.parse().unwrap_or_else(|_| fail("bad slot count")))
                    .collect()
            }
            "-l" | "--seconds" => {
                params.run_seconds = value().parse().unwrap_or_else(|_| fail("bad -l"))
            }
            "-r" | "--runs" => params.runs = value().parse().unwrap_or_else(|_| fail("bad -r")),
            "--lookups" => {
                params.lookups = value().parse().unwrap_or_else(|_| fail("bad --lookups"))
            }
            "--single-ops" => {
                params.single_ops = value().parse().unwrap_or_else(|_| fail("bad --single-ops"))
            }
            "--json" => json = true,
            _ => fail(&format!("unknown option {arg}")),
        }
    }
    match memslot_perf::run(&params) {
        Ok(report) if json => println!("{}", memslot_perf::to_json(&report)),
        Ok(report) => memslot_perf::print_tables(&report),
        Err(e) => fail(&e),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("memslot_perf: {message}");
    std::process::exit(2)
}
