//! The guest's throughput over time: a sampler thread reads the vCPUs'
//! live counters at a fixed interval while the migration runs.

use crate::vm::GuestCounters;
use std::sync::atomic::{AtomicBool, Ordering};
// Lock poisoning: the sample list is only pushed to and cloned, so the
// `unwrap`s only propagate a panic that is already a bug.
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One sample of all vCPUs together.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Seconds since the timeline started.
    pub t_s: f64,
    /// Guest writes so far.
    pub writes: u64,
    /// Nanoseconds the vCPUs spent executing guest accesses so far.
    pub guest_ns: u64,
}

/// One interval between two samples.
#[derive(Clone, Copy, Debug)]
pub struct Interval {
    /// Middle of the interval, seconds.
    pub t_s: f64,
    /// Start and end, seconds.
    pub start_s: f64,
    pub end_s: f64,
    /// Guest writes per second of wall time.
    pub write_rate: f64,
    /// Guest writes per second of guest execution time (the guest's
    /// speed, independent of its pacing); None when too few writes.
    pub speed: Option<f64>,
}

/// A running sampler.
pub struct Timeline {
    /// When sampling started: the zero of every time in the run.
    pub t0: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Timeline {
    /// Starts sampling the guest's counters (`counters`) every `every`.
    pub fn start(
        counters: Arc<dyn Fn() -> GuestCounters + Send + Sync>,
        every: Duration,
    ) -> Timeline {
        let t0 = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::Builder::new()
                .name("migrate-sampler".into())
                .spawn(move || {
                    let mut next = t0;
                    while !stop.load(Ordering::Acquire) {
                        let c = counters();
                        let s = Sample {
                            t_s: t0.elapsed().as_secs_f64(),
                            writes: c.writes,
                            guest_ns: c.guest_ns,
                        };
                        samples.lock().unwrap().push(s);
                        next += every;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                })
                .ok()
        };
        Timeline {
            t0,
            samples,
            stop,
            thread,
        }
    }

    /// Seconds since the start.
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Seconds of `t` since the start.
    pub fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }

    /// Stops sampling and returns the samples.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let s = self.samples.lock().unwrap().clone();
        s
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The intervals between consecutive samples.
pub fn intervals(samples: &[Sample]) -> Vec<Interval> {
    samples
        .windows(2)
        .filter(|w| w[1].t_s > w[0].t_s)
        .map(|w| {
            let dw = w[1].writes.saturating_sub(w[0].writes);
            let dg = w[1].guest_ns.saturating_sub(w[0].guest_ns);
            Interval {
                t_s: (w[0].t_s + w[1].t_s) / 2.0,
                start_s: w[0].t_s,
                end_s: w[1].t_s,
                write_rate: dw as f64 / (w[1].t_s - w[0].t_s),
                speed: (dw >= 16 && dg > 0).then(|| dw as f64 * 1e9 / dg as f64),
            }
        })
        .collect()
}
