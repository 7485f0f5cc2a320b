//! One poll for every attempt an executor plugin runs: every interval, the handles being
//! waited on go to the plugin in one `poll`, and each waiter hears its attempt's state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;

use super::protocol::{Command, State};

/// What a waiter hears: nothing yet, its attempt's state, or why the poll failed.
pub type Heard = Option<Result<State, String>>;

/// The poller of one plugin.
#[derive(Debug)]
pub struct Poller {
    command: Command,
    interval: Duration,
    waiting: Mutex<HashMap<String, watch::Sender<Heard>>>,
    running: Mutex<bool>,
}

impl Poller {
    pub fn new(command: Command, interval: Duration) -> Arc<Poller> {
        Arc::new(Poller {
            command,
            interval,
            waiting: Mutex::new(HashMap::new()),
            running: Mutex::new(false),
        })
    }

    /// A receiver of `handle`'s state, polled from now on until it is done.
    pub fn watch(self: &Arc<Self>, handle: &str) -> watch::Receiver<Heard> {
        let rx = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            let tx = waiting
                .entry(handle.to_owned())
                .or_insert_with(|| watch::channel(None).0);
            tx.subscribe()
        };
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if !*running {
            *running = true;
            let me = self.clone();
            tokio::spawn(async move { me.run().await });
        }
        rx
    }

    /// Marks the poller stopped when nothing is waited on (a `watch` between the listing
    /// and here has its sender in the map).
    fn stop_if_idle(&self) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let idle = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if idle {
            *running = false;
        }
        idle
    }

    /// Tells each waiter of `handles` what `reply` says of its attempt.
    fn tell(&self, handles: &[String], reply: &Result<serde_json::Value, String>) {
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for h in handles {
            let Some(tx) = waiting.get(h) else { continue };
            let state = match reply {
                Ok(r) => serde_json::from_value::<State>(r["attempts"][h].clone())
                    .map_err(|_| format!("the executor plugin's `poll` said nothing of `{h}`")),
                Err(e) => Err(e.clone()),
            };
            let _ = tx.send(Some(state));
        }
    }

    /// Polls while anything is waited on, then stops (the next `watch` starts it again).
    async fn run(self: Arc<Self>) {
        loop {
            let handles: Vec<String> = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                waiting.retain(|_, tx| tx.receiver_count() > 0);
                waiting.keys().cloned().collect()
            };
            if handles.is_empty() {
                if self.stop_if_idle() {
                    return;
                }
                continue;
            }
            let reply = self.command.call("poll", json!({"handles": handles})).await;
            self.tell(&handles, &reply);
            tokio::time::sleep(self.interval).await;
        }
    }
}
