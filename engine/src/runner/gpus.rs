//! The GPUs of the machine, handed to the stages that ask for them.

/// The machine's GPUs: a stage asking for `n` waits until `n` are free and gets their
/// indices (as `CUDA_VISIBLE_DEVICES`), so two stages never share one.
#[derive(Debug)]
pub(super) struct GpuPool {
    free: std::sync::Mutex<Vec<bool>>,
    released: tokio::sync::Notify,
}

impl GpuPool {
    pub(super) fn new(n: usize) -> Self {
        GpuPool {
            free: std::sync::Mutex::new(vec![true; n]),
            released: tokio::sync::Notify::new(),
        }
    }

    pub(super) async fn acquire(&self, n: usize) -> Vec<usize> {
        loop {
            let notified = self.released.notified();
            {
                let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
                let idle: Vec<usize> = (0..free.len()).filter(|&i| free[i]).take(n).collect();
                if idle.len() == n {
                    for &i in &idle {
                        free[i] = false;
                    }
                    return idle;
                }
            }
            notified.await;
        }
    }

    pub(super) fn release(&self, gpus: &[usize]) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for &i in gpus {
            free[i] = true;
        }
        drop(free);
        self.released.notify_waiters();
    }
}
