//! A description of the machine and its KVM, for output a KVM engineer can paste into a
//! mailing-list reply next to the figures.

/// The host's identity, read from /proc and /sys; fields are "unknown" where unreadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// `uname -r`.
    pub kernel_release: String,
    /// `uname -v` (build string).
    pub kernel_version: String,
    /// The first `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// `MemTotal` of /proc/meminfo, in KiB.
    pub mem_total_kib: u64,
    /// The KVM vendor modules that are loaded (`kvm_intel`, `kvm_amd`, `kvm_pvm`).
    pub kvm_modules: Vec<String>,
    /// The `kvm` module parameters that shape the MMU path (`tdp_mmu`, `eager_page_split`),
    /// as `name=value`.
    pub kvm_mmu_params: Vec<String>,
    /// /sys/kernel/mm/transparent_hugepage/enabled.
    pub thp_mode: String,
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

impl HostInfo {
    /// Reads the description of this machine.
    pub fn detect() -> HostInfo {
        let unknown = || "unknown".to_string();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(unknown);
        let mem_total_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        let kvm_modules = ["kvm_intel", "kvm_amd", "kvm_pvm"]
            .iter()
            .filter(|m| std::path::Path::new(&format!("/sys/module/{m}")).exists())
            .map(|m| m.to_string())
            .collect();
        let kvm_mmu_params = ["tdp_mmu", "eager_page_split"]
            .iter()
            .filter_map(|p| {
                read_trimmed(&format!("/sys/module/kvm/parameters/{p}")).map(|v| format!("{p}={v}"))
            })
            .collect();
        HostInfo {
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(unknown),
            kernel_version: read_trimmed("/proc/sys/kernel/version").unwrap_or_else(unknown),
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_total_kib,
            kvm_modules,
            kvm_mmu_params,
            thp_mode: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_else(unknown),
        }
    }

    /// One line: `Linux 6.18.0 (#1 SMP ...), Intel(R) ... x 2 CPUs, 24 GiB, KVM: kvm_pvm
    /// (tdp_mmu=N eager_page_split=Y)`.
    pub fn one_line(&self) -> String {
        format!(
            "Linux {} ({}), {} x {} CPUs, {} MiB, KVM: {} ({}), THP {}",
            self.kernel_release,
            self.kernel_version,
            self.cpu_model,
            self.cpus,
            self.mem_total_kib / 1024,
            if self.kvm_modules.is_empty() {
                "none loaded".to_string()
            } else {
                self.kvm_modules.join(",")
            },
            self.kvm_mmu_params.join(" "),
            self.thp_mode
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_something_sensible() {
        let info = HostInfo::detect();
        assert!(info.cpus >= 1);
        assert!(info.one_line().starts_with("Linux "));
    }
}
