//! The server's side of approvals: timeouts decided when they pass, and runs whose
//! approvals are decided resumed (each by one replica, in this process).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::server::Server;

impl Server {
    /// Every second: decides the approvals whose timeout passed, and resumes the waiting
    /// runs whose approvals are all decided (on the command line, by a timeout, by a
    /// server that stopped before it resumed them; a decision made through this server's
    /// API resumes its run at once).
    pub(crate) async fn approval_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::SeqCst) {
            if let Err(e) = self.settle_approvals().await {
                eprintln!("approvals: {e:#}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn settle_approvals(self: &Arc<Self>) -> anyhow::Result<()> {
        let state = self.engine.state().clone();
        let (expired, ready) = tokio::task::spawn_blocking(move || {
            let expired = state.expire_approvals(&drivetrain_engine::state::now())?;
            let mut ready = Vec::new();
            for run in state.decided_waiting_runs()? {
                if state.claim_waiting(&run)? {
                    ready.push(run);
                }
            }
            anyhow::Ok((expired, ready))
        })
        .await??;
        for a in &expired {
            println!(
                "approval {}/{}: {}",
                a.request.run,
                a.request.stage,
                a.reason.as_deref().unwrap_or("timed out")
            );
        }
        for run in &ready {
            println!("run {run}: its approvals are decided; resuming it");
        }
        self.resume(&ready).await
    }
}
