//! What an attempt's GPUs did while it ran, from NVML: the mean utilization of the GPUs
//! it was given and the most GPU memory its processes held at once.
//!
//! An attempt given GPUs (its `CUDA_VISIBLE_DEVICES`) gets a thread that asks NVML every
//! [`SAMPLE_EVERY`] for two things:
//! - **utilization**: the driver's own samples of "a kernel was running" (percent, about
//!   six a second on recent GPUs) since the last ask, from its ring buffer
//!   (`nvmlDeviceGetSamples`), so a short attempt is measured from what the driver saw,
//!   not from how often we asked; where a GPU keeps no samples, its current
//!   `utilization_rates().gpu`. The engine gives a GPU to one stage at a time, so the
//!   device's utilization is the attempt's.
//! - **memory**: the GPU memory of each process on those GPUs that is in the attempt's
//!   cgroup (its `cgroup.procs`, host pids, as NVML reports them); with no cgroup, every
//!   process on them. The peak is of the sum over the attempt's GPUs at one moment.
//!
//! On a machine without NVML nothing is started and the attempt records no GPU usage.

use std::path::PathBuf;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, Sample};

/// How often the watch asks NVML.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// What the attempt's GPUs did, so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct GpuUsage {
    /// Sum and count of utilization samples (percent), over all the attempt's GPUs.
    util_sum: f64,
    util_samples: u64,
    /// The most GPU memory the attempt's processes held at one moment, summed over GPUs.
    pub(super) peak_memory_bytes: Option<u64>,
}

impl GpuUsage {
    /// Mean utilization (0–100) over every sample of every GPU.
    pub(super) fn utilization_percent(&self) -> Option<f64> {
        (self.util_samples > 0).then(|| self.util_sum / self.util_samples as f64)
    }

    /// Adds the driver's utilization samples taken after `since` (µs since the epoch).
    fn add_samples(&mut self, samples: &[Sample], since: u64) {
        for s in samples.iter().filter(|s| s.timestamp > since) {
            if let Some(v) = percent(&s.value) {
                self.add_utilization(v);
            }
        }
    }

    fn add_utilization(&mut self, percent: f64) {
        self.util_sum += percent.clamp(0.0, 100.0);
        self.util_samples += 1;
    }

    /// Adds one moment's memory: what the processes of `procs` that `mine` says are the
    /// attempt's held, summed over the GPUs (each GPU's list one entry of `on_gpus`).
    fn add_memory(&mut self, on_gpus: &[Vec<ProcessInfo>], mine: impl Fn(u32) -> bool) {
        let held: Vec<u64> = on_gpus
            .iter()
            .flatten()
            .filter(|p| mine(p.pid))
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            })
            .collect();
        // None until a process of the attempt is on one of its GPUs.
        if !held.is_empty() || self.peak_memory_bytes.is_some() {
            let now = held.iter().sum::<u64>();
            self.peak_memory_bytes = Some(self.peak_memory_bytes.unwrap_or(0).max(now));
        }
    }
}

fn percent(v: &SampleValue) -> Option<f64> {
    match *v {
        SampleValue::U32(x) => Some(x as f64),
        SampleValue::U64(x) => Some(x as f64),
        SampleValue::I64(x) => Some(x as f64),
        SampleValue::F64(x) => Some(x),
    }
}

/// Microseconds since the epoch: the clock NVML stamps its samples with.
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The running watch of one attempt's GPUs.
pub(super) struct GpuWatch {
    stop: Sender<()>,
    thread: std::thread::JoinHandle<GpuUsage>,
}

impl GpuWatch {
    /// Starts watching the GPUs `visible` names (a `CUDA_VISIBLE_DEVICES` value) for an
    /// attempt whose processes `procs` lists (a cgroup's `cgroup.procs`; `None`: every
    /// process on those GPUs is the attempt's). `None` where NVML knows none of them.
    pub(super) fn start(visible: &str, procs: Option<PathBuf>) -> Option<GpuWatch> {
        let nvml = crate::gpus::nvml()?;
        let devices: Vec<_> = crate::gpus::visible_devices(visible)
            .iter()
            .filter_map(|id| crate::gpus::device(nvml, id))
            .collect();
        if devices.is_empty() {
            return None;
        }
        let (stop, stopped) = channel::<()>();
        let thread = std::thread::Builder::new()
            .name("gpu-usage".into())
            .spawn(move || {
                let mut usage = GpuUsage::default();
                let mut seen = vec![now_micros(); devices.len()];
                loop {
                    let ending = match stopped.recv_timeout(SAMPLE_EVERY) {
                        Err(RecvTimeoutError::Timeout) => false,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                    };
                    for (device, seen) in devices.iter().zip(seen.iter_mut()) {
                        match device.samples(Sampling::GpuUtilization, *seen) {
                            Ok(samples) => {
                                usage.add_samples(&samples, *seen);
                                *seen = samples.iter().map(|s| s.timestamp).fold(*seen, u64::max);
                            }
                            // No samples kept (or none yet): what the GPU says now.
                            Err(_) => {
                                if let Ok(u) = device.utilization_rates() {
                                    usage.add_utilization(u.gpu as f64);
                                }
                            }
                        }
                    }
                    // Once it is ending its processes are gone: no moment of memory then.
                    if ending {
                        return usage;
                    }
                    let on_gpus: Vec<Vec<ProcessInfo>> = devices
                        .iter()
                        .map(|d| {
                            let mut all = d.running_compute_processes().unwrap_or_default();
                            all.extend(d.running_graphics_processes().unwrap_or_default());
                            all
                        })
                        .collect();
                    let pids = procs.as_ref().map(|p| read_pids(p));
                    usage.add_memory(&on_gpus, |pid| {
                        pids.as_ref().is_none_or(|set| set.contains(&pid))
                    });
                }
            })
            .ok()?;
        Some(GpuWatch { stop, thread })
    }

    /// Stops watching (after one last ask for the driver's samples) and says what the
    /// GPUs did.
    pub(super) fn finish(self) -> GpuUsage {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// The pids a `cgroup.procs` file lists now.
fn read_pids(path: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(timestamp: u64, v: u32) -> Sample {
        Sample {
            timestamp,
            value: SampleValue::U32(v),
        }
    }

    fn proc(pid: u32, bytes: u64) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(bytes),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn utilization_is_the_mean_of_the_samples_taken_while_it_ran() {
        let mut u = GpuUsage::default();
        assert_eq!(u.utilization_percent(), None);
        // Samples from before the attempt started (the driver's buffer holds the past
        // too) are not the attempt's.
        u.add_samples(&[sample(90, 100), sample(100, 100), sample(110, 80)], 100);
        u.add_samples(&[sample(120, 40)], 110);
        assert_eq!(u.utilization_percent(), Some(60.0));
        u.add_utilization(250.0); // clamped: a percent is at most 100
        assert_eq!(u.utilization_percent(), Some(220.0 / 3.0));
    }

    #[test]
    fn memory_is_the_peak_of_the_attempts_processes_summed_over_its_gpus() {
        let mut u = GpuUsage::default();
        let mine = |pid: u32| pid == 7 || pid == 8;
        // Another process on the GPU alone: the attempt held nothing, recorded as none.
        u.add_memory(&[vec![proc(99, 1 << 30)]], mine);
        assert_eq!(u.peak_memory_bytes, None);
        // Two GPUs at one moment: summed; the stranger is left out.
        u.add_memory(
            &[vec![proc(7, 300), proc(99, 5000)], vec![proc(8, 200)]],
            mine,
        );
        assert_eq!(u.peak_memory_bytes, Some(500));
        // Less later: the peak stays.
        u.add_memory(&[vec![proc(7, 100)], vec![]], mine);
        assert_eq!(u.peak_memory_bytes, Some(500));
        u.add_memory(
            &[vec![ProcessInfo {
                used_gpu_memory: UsedGpuMemory::Unavailable,
                ..proc(7, 0)
            }]],
            mine,
        );
        assert_eq!(u.peak_memory_bytes, Some(500));
    }

    #[test]
    fn no_nvml_no_watch() {
        // This machine and CI have no NVIDIA driver; where one is, an unknown UUID is no
        // GPU of the attempt's either.
        if crate::gpus::nvml().is_none() {
            assert!(GpuWatch::start("0", None).is_none());
        }
        assert!(GpuWatch::start("GPU-00000000-0000-0000-0000-000000000000", None).is_none());
        assert!(GpuWatch::start("", None).is_none());
    }
}
