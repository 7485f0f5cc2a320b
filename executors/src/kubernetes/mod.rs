//! The kubernetes executor: one Job (or Kubeflow MPIJob / PyTorchJob) per stage attempt,
//! created with kube-rs and watched, never polled.
//!
//! - [`render`] turns an [`AttemptSpec`] into typed objects; `drivetrain plan --executor
//!   kubernetes --manifests` prints the same objects.
//! - The workload's name is deterministic from (run, stage, attempt, item): a creation
//!   re-submitted after an engine crash answers `AlreadyExists`, and the executor watches
//!   the Job that already runs instead of starting a second one.
//! - The engine owns retries (`backoffLimit: 0`); pod failure reasons (ImagePullBackOff,
//!   OOMKilled, Evicted, Unschedulable past its limit, DeadlineExceeded) become the
//!   attempt's reason; pod logs stream into the attempt's log; cancel deletes the
//!   workload with foreground propagation.
//! - In the pod, `drivetrain exec` (copied in by an init container) moves inputs and
//!   outputs through the object store, as the run loop's transfer plan says.
//!
//! Settings come from the YAML file named by `DRIVETRAIN_KUBERNETES` ([`Settings`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, RunningAttempt,
};
use futures::{AsyncBufReadExt as _, Stream, StreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, LogParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::Client;
use serde::Deserialize;

pub mod render;
#[cfg(any(test, feature = "testing"))]
pub mod standin;
#[cfg(test)]
mod tests;

use render::{Object, Rendered};

/// How the executor reaches the cluster and what every pod gets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The kubeconfig file; default: in-cluster, else `KUBECONFIG`, else `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; default: its current context.
    pub context: Option<String>,
    pub namespace: String,
    pub service_account: Option<String>,
    pub image_pull_secrets: Vec<String>,
    /// Added to every pod's node selector (a stage's own entries win).
    pub node_selector: BTreeMap<String, String>,
    /// Added to every pod's tolerations.
    pub tolerations: Vec<Toleration>,
    /// Added to every object's labels.
    pub labels: BTreeMap<String, String>,
    /// How long finished Jobs stay for inspection. `null` keeps them.
    pub ttl_seconds_after_finished: Option<i32>,
    /// How long a pod may stay unschedulable (or a gang stay queued) before the attempt
    /// fails with that reason: `10m`.
    #[serde(with = "humantime_serde_compat")]
    pub unschedulable_timeout: Duration,
    /// Gang scheduling of distributed stages: `{scheduler: kueue, queue: NAME}` or
    /// `{scheduler: volcano, queue: NAME}`.
    pub gang: Option<Gang>,
    /// Every workload to the Kueue `LocalQueue` named after its run's project (created
    /// suspended; Kueue admits it within the quota of that queue's `ClusterQueue`), over
    /// `gang`'s queue.
    pub project_queues: bool,
    /// The image holding the drivetrain binaries, whose init container copies the wrapper
    /// into every pod.
    pub wrapper_image: String,
    /// Where the wrapper, `drivetrain-exec`, is in `wrapper_image`: every pod of a
    /// stage's own command gets a copy.
    pub wrapper_path: String,
    /// Where the whole `drivetrain` binary is in `wrapper_image`: the pods of built-in
    /// steps (`drivetrain step NAME`) get a copy.
    pub binary_path: String,
    /// The pod-local directory of the wrapper, inputs and outputs (an emptyDir).
    pub root: PathBuf,
    /// The rendezvous port of distributed ranks (`MASTER_PORT`).
    pub master_port: u16,
    /// The class a `preemptible` stage that names no priority class of its own gets: a
    /// low Kueue `WorkloadPriorityClass` (or `PriorityClass`) the admin made.
    pub preemptible_class: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            kubeconfig: None,
            context: None,
            namespace: "default".into(),
            service_account: None,
            image_pull_secrets: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            labels: BTreeMap::new(),
            ttl_seconds_after_finished: Some(86_400),
            unschedulable_timeout: Duration::from_secs(600),
            gang: None,
            project_queues: false,
            wrapper_image: "drivetrain:0.1.0".into(),
            wrapper_path: "/usr/local/bin/drivetrain-exec".into(),
            binary_path: "/usr/local/bin/drivetrain".into(),
            root: PathBuf::from("/drivetrain"),
            master_port: 29500,
            preemptible_class: "preemptible".into(),
        }
    }
}

/// Gang scheduling: all ranks of a distributed stage start together or not at all.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "scheduler", rename_all = "lowercase", deny_unknown_fields)]
pub enum Gang {
    /// Kueue: the workload carries the queue-name label and is created suspended; Kueue
    /// admits it when the whole gang fits.
    Kueue { queue: String },
    /// Volcano: `schedulerName: volcano` and a PodGroup with `minMember` = all ranks.
    Volcano {
        #[serde(default = "default_queue")]
        queue: String,
    },
}

fn default_queue() -> String {
    "default".into()
}

mod humantime_serde_compat {
    use serde::{Deserialize as _, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        drivetrain_engine::units::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("unschedulable_timeout: {e}")))
    }
}

impl Settings {
    /// The settings in the file `DRIVETRAIN_KUBERNETES` names, else the defaults.
    pub fn from_env() -> Result<Settings, String> {
        match std::env::var_os("DRIVETRAIN_KUBERNETES") {
            Some(path) => Settings::from_file(&PathBuf::from(path)),
            None => Ok(Settings::default()),
        }
    }

    pub fn from_file(path: &std::path::Path) -> Result<Settings, String> {
        crate::settings_file(path)
    }
}

/// Runs attempts as Kubernetes workloads.
pub struct KubernetesExecutor {
    settings: Arc<Settings>,
    client: tokio::sync::OnceCell<Client>,
    /// A client given by the caller (tests), used everywhere.
    given: Option<Client>,
}

impl std::fmt::Debug for KubernetesExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesExecutor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KubernetesExecutor {
    /// An executor that connects on its first attempt.
    pub fn new(settings: Settings) -> Self {
        KubernetesExecutor {
            settings: Arc::new(settings),
            client: tokio::sync::OnceCell::new(),
            given: None,
        }
    }

    /// An executor with a client of the caller's (tests).
    pub fn with_client(settings: Settings, client: Client) -> Self {
        KubernetesExecutor {
            settings: Arc::new(settings),
            client: tokio::sync::OnceCell::new_with(Some(client.clone())),
            given: Some(client),
        }
    }

    /// The client attempts share (created on the first attempt, on the run's runtime).
    async fn client(&self) -> Result<Client, ExecutorError> {
        self.client
            .get_or_try_init(|| self.connect())
            .await
            .cloned()
    }

    /// A new client: for calls made from a runtime of their own (a resume's or a
    /// cancel's clean-up), which must not keep one bound to a runtime that is gone.
    async fn connect(&self) -> Result<Client, ExecutorError> {
        if let Some(c) = &self.given {
            return Ok(c.clone());
        }
        let s = &self.settings;
        let options = kube::config::KubeConfigOptions {
            context: s.context.clone(),
            ..Default::default()
        };
        let config = match (&s.kubeconfig, &s.context) {
            (Some(path), _) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()));
                match kc {
                    Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| e.to_string()),
            (None, None) => kube::Config::infer().await.map_err(|e| e.to_string()),
        };
        config
            .and_then(|c| Client::try_from(c).map_err(|e| e.to_string()))
            .map_err(|e| ExecutorError(format!("cannot reach the Kubernetes API: {e}")))
    }
}

fn api_error(what: &str, e: kube::Error) -> ExecutorError {
    ExecutorError(format!("{what}: {e}"))
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Creates `object`; one that already exists (a creation re-submitted after a crash) is
/// taken as it is. Returns the object's uid.
async fn create(
    client: &Client,
    ns: &str,
    object: &Object,
) -> Result<Option<String>, ExecutorError> {
    let what = format!("cannot create {} {}", object.kind(), object.name());
    match object {
        Object::Job(j) => create_in(Api::namespaced(client.clone(), ns), &**j, &what).await,
        Object::Service(s) => create_in(Api::namespaced(client.clone(), ns), &**s, &what).await,
        Object::Claim(c) => create_in(Api::namespaced(client.clone(), ns), &**c, &what).await,
        Object::Custom(d, ar) => {
            create_in(Api::namespaced_with(client.clone(), ns, ar), &**d, &what).await
        }
    }
}

async fn create_in<K>(api: Api<K>, object: &K, what: &str) -> Result<Option<String>, ExecutorError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(o) => Ok(o.meta().uid.clone()),
        Err(e) if is_status(&e, 409) => {
            let name = object.meta().name.clone().unwrap_or_default();
            api.get(&name)
                .await
                .map(|o| o.meta().uid.clone())
                .map_err(|e| api_error(what, e))
        }
        Err(e) => Err(api_error(what, e)),
    }
}

fn resource_of(kind: &str) -> ApiResource {
    match kind {
        "MPIJob" => render::mpijob_resource(),
        "PyTorchJob" => render::pytorchjob_resource(),
        _ => ApiResource::erase::<Job>(&()),
    }
}

/// Deletes a workload and (foreground) everything it owns. Whether it existed.
async fn delete_workload(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource_of(kind));
    match api.delete(name, &DeleteParams::foreground()).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, 404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Why a pod cannot mount `volume`, if it cannot: claims, scratch space and claims
/// restored from snapshots are rendered (`render.rs`); a path of the engine's machine
/// is not.
pub fn refuses_volume(volume: &drivetrain_engine::spec::VolumeSpec) -> Option<String> {
    volume.host_path.as_ref().map(|_| {
        "`host_path` is a path of the engine's machine, not of the cluster's nodes (and most \
         clusters forbid hostPath pods): put the data in a PersistentVolumeClaim and give \
         `claim`"
            .to_owned()
    })
}

#[async_trait]
impl Executor for KubernetesExecutor {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    /// A Secret volume at the mount path (`render.rs`).
    fn mounts_secret_files(&self) -> bool {
        true
    }

    fn refuses_volume(&self, volume: &drivetrain_engine::spec::VolumeSpec) -> Option<String> {
        refuses_volume(volume)
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        if spec.placement.network == drivetrain_engine::spec::Network::None {
            // A pod's network is the cluster's; cutting it takes a NetworkPolicy (and a
            // CNI that enforces one), which is not rendered yet: never run it connected.
            return Err(ExecutorError(format!(
                "stage `{}` has `network: none`, which the kubernetes executor cannot give it yet (it renders no NetworkPolicy)",
                spec.stage
            )));
        }
        let client = self.client().await?;
        let ns = self.settings.namespace.clone();
        let Rendered {
            mut objects,
            workload: (kind, name),
        } = render::render(&self.settings, &spec);
        // The workload first, then what it owns (so a cancel or the TTL removes them).
        let workload = objects.pop().expect("render ends with the workload");
        let uid = create(&client, &ns, &workload).await?;
        let resource = resource_of(&kind);
        for mut object in objects {
            if let Some(uid) = &uid {
                let owner = OwnerReference {
                    api_version: resource.api_version.clone(),
                    kind: kind.clone(),
                    name: name.clone(),
                    uid: uid.clone(),
                    block_owner_deletion: Some(true),
                    controller: Some(false),
                };
                let meta = match &mut object {
                    Object::Job(j) => &mut j.metadata,
                    Object::Service(s) => &mut s.metadata,
                    Object::Claim(c) => &mut c.metadata,
                    Object::Custom(d, _) => &mut d.metadata,
                };
                meta.owner_references = Some(vec![owner]);
            }
            create(&client, &ns, &object).await?;
        }
        Ok(Box::new(KubeAttempt {
            client,
            settings: self.settings.clone(),
            kind,
            name,
            spec,
            started: Instant::now(),
            cancelled: false,
            made: None,
        }))
    }

    async fn reap(&self, handle: &str) -> bool {
        let Some((ns, kind, name)) = parse_handle(handle) else {
            return false;
        };
        let Ok(client) = self.connect().await else {
            return false;
        };
        delete_workload(&client, ns, kind, name)
            .await
            .unwrap_or(false)
    }

    async fn reattach(&self, handle: &str) -> bool {
        let Some((ns, kind, name)) = parse_handle(handle) else {
            return false;
        };
        let Ok(client) = self.connect().await else {
            return false;
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &resource_of(kind));
        matches!(api.get_opt(name).await, Ok(Some(_)))
    }

    fn container_root(&self) -> Option<PathBuf> {
        Some(self.settings.root.clone())
    }
}

/// What a distributed attempt's log lines start with: the pod's rank.
fn log_prefix(pod: &Pod, ranks: u32) -> String {
    if ranks <= 1 {
        return String::new();
    }
    let index = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("batch.kubernetes.io/job-completion-index"))
        .cloned()
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    format!("[{index}] ")
}

/// `namespace/Kind/name`
fn parse_handle(handle: &str) -> Option<(&str, &str, &str)> {
    let mut parts = handle.splitn(3, '/');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// A started workload.
struct KubeAttempt {
    client: Client,
    settings: Arc<Settings>,
    kind: String,
    name: String,
    spec: AttemptSpec,
    started: Instant,
    cancelled: bool,
    /// What `made` reports: the VolumeSnapshot taken after the attempt.
    made: Option<serde_json::Value>,
}

impl std::fmt::Debug for KubeAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAttempt")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .finish()
    }
}

type EventStream<K> = Pin<Box<dyn Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

/// What the watched objects say about the attempt.
#[derive(Debug, Default)]
struct Seen {
    /// The workload's status conditions that are true: (type, reason, message).
    conditions: Vec<(String, String, String)>,
    suspended: bool,
    /// Seen not suspended once: admitted by its queue (or never queued). Suspended again
    /// after that, its queue evicted it (Kueue's preemption).
    admitted: bool,
    gone: bool,
    pods: BTreeMap<String, Pod>,
    /// When each pod was first seen unschedulable.
    unschedulable_since: BTreeMap<String, Instant>,
    /// When the workload was first seen failed (its pods' last states may follow).
    failed_at: Option<Instant>,
}

fn true_conditions(status: Option<&serde_json::Value>) -> Vec<(String, String, String)> {
    let text =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|s| s.as_str()).unwrap_or("").to_owned();
    status
        .and_then(|s| s.get("conditions"))
        .and_then(|c| c.as_array())
        .map(|cs| {
            cs.iter()
                .filter(|c| c.get("status").and_then(|s| s.as_str()) == Some("True"))
                .map(|c| (text(c, "type"), text(c, "reason"), text(c, "message")))
                .collect()
        })
        .unwrap_or_default()
}

impl Seen {
    fn workload(&mut self, object: &DynamicObject) {
        self.conditions = true_conditions(object.data.get("status"));
        let spec = object.data.get("spec");
        self.suspended = spec
            .and_then(|s| {
                s.get("suspend")
                    .or_else(|| s.get("runPolicy").and_then(|r| r.get("suspend")))
            })
            .and_then(|s| s.as_bool())
            .unwrap_or(false);
        self.admitted |= !self.suspended;
    }

    /// A pod the scheduler preempted for one of a higher priority (its
    /// `DisruptionTarget` condition): which, and why.
    fn pod_preempted(&self) -> Option<String> {
        self.pods.iter().find_map(|(name, pod)| {
            let c = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
            let reason = c.reason.as_deref().unwrap_or("");
            reason.starts_with("Preemption").then(|| {
                format!(
                    "pod {name}: {reason}: {}",
                    c.message.as_deref().unwrap_or("")
                )
            })
        })
    }

    /// The main container's termination in `pod`: (exit code, reason).
    fn terminated(pod: &Pod, container: &str) -> Option<(i32, String)> {
        pod.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == container)?
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| (t.exit_code, t.reason.clone().unwrap_or_default()))
    }

    /// A reason for the attempt to fail now, from its pods.
    fn pod_failure(&mut self, limit: Duration) -> Option<String> {
        let now = Instant::now();
        for (name, pod) in &self.pods {
            let Some(status) = &pod.status else { continue };
            if status.reason.as_deref() == Some("Evicted") {
                return Some(format!(
                    "Evicted: pod {name}: {}",
                    status.message.clone().unwrap_or_default()
                ));
            }
            for c in status
                .init_container_statuses
                .iter()
                .flatten()
                .chain(status.container_statuses.iter().flatten())
            {
                if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                    let reason = w.reason.as_deref().unwrap_or("");
                    if matches!(
                        reason,
                        "ImagePullBackOff"
                            | "ErrImagePull"
                            | "InvalidImageName"
                            | "CreateContainerConfigError"
                    ) {
                        return Some(format!(
                            "{reason}: pod {name}, container {}: {}",
                            c.name,
                            w.message.clone().unwrap_or_default()
                        ));
                    }
                }
            }
            let unschedulable = status.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
            match unschedulable {
                Some(c) => {
                    let since = *self.unschedulable_since.entry(name.clone()).or_insert(now);
                    if now.duration_since(since) >= limit {
                        return Some(format!(
                            "Unschedulable for {}: pod {name}: {}",
                            humantime::format_duration(limit),
                            c.message.clone().unwrap_or_default()
                        ));
                    }
                }
                None => {
                    self.unschedulable_since.remove(name);
                }
            }
        }
        None
    }

    /// The exit code and reason of the first failed main container.
    fn failed_container(&self, container: &str) -> Option<(i32, String)> {
        self.pods
            .values()
            .filter_map(|p| Seen::terminated(p, container))
            .find(|(code, _)| *code != 0)
    }
}

/// The attempt's log, written by the task that follows each pod's.
type SharedLog = Arc<std::sync::Mutex<std::fs::File>>;

impl KubeAttempt {
    fn main_container(&self) -> &'static str {
        if self.kind == "PyTorchJob" {
            "pytorch"
        } else {
            render::MAIN
        }
    }

    fn outcome(&self, seen: &mut Seen) -> Option<AttemptOutcome> {
        let has = |t: &str| seen.conditions.iter().find(|(ty, _, _)| ty == t).cloned();
        if has("Complete").is_some() || has("Succeeded").is_some() {
            return Some(AttemptOutcome::Succeeded);
        }
        if let Some((_, reason, message)) = has("Failed") {
            // The pods' watch may lag the workload's: give it a moment to tell how the
            // container ended.
            let since = *seen.failed_at.get_or_insert_with(Instant::now);
            let failed = seen.failed_container(self.main_container());
            if failed.is_none()
                && reason != "DeadlineExceeded"
                && since.elapsed() < Duration::from_secs(3)
            {
                return None;
            }
            let (exit_code, detail) = match failed {
                Some((code, why)) if !why.is_empty() && why != "Error" => {
                    (Some(code), format!("{why} (exit code {code})"))
                }
                // The wrapper's (and a shell's) code for a command that does not exist.
                Some((127, _)) => (
                    Some(127),
                    format!(
                        "command not found (exit code 127): `{}`",
                        self.spec.argv.first().map(String::as_str).unwrap_or("")
                    ),
                ),
                Some((code, _)) => (Some(code), format!("exit code {code}")),
                None => (None, message.clone()),
            };
            let reason = match reason.as_str() {
                "DeadlineExceeded" => format!(
                    "DeadlineExceeded: the Job ran past its activeDeadlineSeconds; {message}"
                ),
                "" | "BackoffLimitExceeded" => detail,
                other => format!("{other}: {detail}"),
            };
            return Some(AttemptOutcome::Failed { exit_code, reason });
        }
        if seen.gone {
            return Some(AttemptOutcome::Failed {
                exit_code: None,
                reason: format!("lost: {} {} was deleted while it ran", self.kind, self.name),
            });
        }
        let preempted = match seen.suspended && seen.admitted {
            true => Some(format!("{} {} was suspended again by its queue (Kueue evicted it for a workload of higher priority)", self.kind, self.name)),
            false => seen.pod_preempted(),
        };
        if let Some(why) = preempted {
            return Some(AttemptOutcome::Preempted {
                reason: format!("preempted by the cluster: {why}; it is submitted again (a pod's checkpoints live as long as the pod: what it keeps on a volume it finds again)"),
            });
        }
        let limit = self.settings.unschedulable_timeout;
        if seen.suspended && self.started.elapsed() >= limit {
            return Some(AttemptOutcome::Failed {
                exit_code: None,
                reason: format!(
                    "Unschedulable for {}: the gang was not admitted by its queue",
                    humantime::format_duration(limit)
                ),
            });
        }
        seen.pod_failure(limit)
            .map(|reason| AttemptOutcome::Failed {
                exit_code: None,
                reason,
            })
    }

    /// Follows the main container's log of `pod` into the attempt's log.
    fn follow_log(
        &self,
        pod: String,
        prefix: String,
        log: SharedLog,
    ) -> tokio::task::JoinHandle<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let params = LogParams {
            container: Some(self.main_container().into()),
            follow: true,
            ..Default::default()
        };
        tokio::spawn(async move {
            let stream = match api.log_stream(&pod, &params).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("cannot stream the log of pod {pod}: {e}");
                    return;
                }
            };
            let mut lines = stream.lines();
            while let Some(line) = lines.next().await {
                let Ok(line) = line else { break };
                use std::io::Write as _;
                if let Ok(mut f) = log.lock() {
                    let _ = writeln!(f, "{prefix}{line}");
                }
            }
        })
    }

    /// Follows the log of every pod that has started and is not followed yet.
    fn follow_started(
        &self,
        seen: &Seen,
        followed: &mut BTreeMap<String, tokio::task::JoinHandle<()>>,
        log: &SharedLog,
        ranks: u32,
    ) {
        for (name, pod) in &seen.pods {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            let started = Seen::terminated(pod, self.main_container()).is_some()
                || pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.name == self.main_container()
                                && c.state.as_ref().is_some_and(|s| s.running.is_some())
                        })
                    });
            if (phase != "Pending" || started) && !followed.contains_key(name) {
                let prefix = log_prefix(pod, ranks);
                followed.insert(
                    name.clone(),
                    self.follow_log(name.clone(), prefix, log.clone()),
                );
            }
        }
    }

    /// The workload's end can arrive before its pods' updates: reads the logs of pods
    /// not followed yet, then lets every stream drain (they end with the containers).
    async fn drain_logs(
        &self,
        mut followed: BTreeMap<String, tokio::task::JoinHandle<()>>,
        log: &SharedLog,
        ranks: u32,
    ) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let selector = kube::api::ListParams::default().labels(&format!(
            "{}={}",
            render::LABEL_WORKLOAD,
            self.name
        ));
        if let Ok(list) = pods.list(&selector).await {
            for pod in list.items {
                let name = pod.metadata.name.clone().unwrap_or_default();
                if !followed.contains_key(&name) {
                    let prefix = log_prefix(&pod, ranks);
                    followed.insert(name.clone(), self.follow_log(name, prefix, log.clone()));
                }
            }
        }
        for (_, task) in followed {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    /// Takes the snapshot the stage asks for after an attempt that ended with `outcome`,
    /// and says so in its log. `Some` fails a succeeded attempt whose snapshot failed.
    async fn take_snapshot(
        &mut self,
        outcome: &AttemptOutcome,
        log: &SharedLog,
    ) -> Option<AttemptOutcome> {
        use std::io::Write as _;
        let succeeded = *outcome == AttemptOutcome::Succeeded;
        let snapshot = self.spec.placement.snapshot.as_ref()?;
        if !succeeded && snapshot.when != drivetrain_engine::spec::SnapshotWhen::Always {
            return None;
        }
        let volume = snapshot.volume.clone();
        let line = match self.snapshot().await {
            Ok(Some((name, claim))) => {
                let ns = &self.settings.namespace;
                self.made = Some(serde_json::json!({"snapshot": {
                    "name": name, "namespace": ns, "claim": claim, "volume": volume,
                }}));
                format!("drivetrain: VolumeSnapshot {name} of claim {claim} created")
            }
            Ok(None) => "drivetrain: nothing to snapshot".into(),
            Err(e) if succeeded => {
                return Some(AttemptOutcome::Failed {
                    exit_code: None,
                    reason: e.0,
                })
            }
            Err(e) => format!("drivetrain: {}", e.0),
        };
        if let Ok(mut f) = log.lock() {
            let _ = writeln!(f, "{line}");
        }
        None
    }

    /// Takes the stage's snapshot: its name and the claim it is of.
    async fn snapshot(&self) -> Result<Option<(String, String)>, ExecutorError> {
        let Some(object) = render::snapshot(&self.settings, &self.spec) else {
            return Ok(None);
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        let claim = object.data["spec"]["source"]["persistentVolumeClaimName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ar = render::volumesnapshot_resource();
        create(
            &self.client,
            &self.settings.namespace,
            &Object::Custom(Box::new(object), ar),
        )
        .await?;
        Ok(Some((name, claim)))
    }
}

#[async_trait]
impl RunningAttempt for KubeAttempt {
    fn handle(&self) -> String {
        format!("{}/{}/{}", self.settings.namespace, self.kind, self.name)
    }

    async fn wait(&mut self) -> AttemptOutcome {
        if self.cancelled {
            return AttemptOutcome::Cancelled;
        }
        let ns = self.settings.namespace.clone();
        let log = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
        {
            Ok(f) => Arc::new(std::sync::Mutex::new(f)),
            Err(e) => {
                return AttemptOutcome::Failed {
                    exit_code: None,
                    reason: format!("cannot open the log {}: {e}", self.spec.log.display()),
                }
            }
        };
        let workloads: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &resource_of(&self.kind));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let by_name = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let by_label =
            watcher::Config::default().labels(&format!("{}={}", render::LABEL_WORKLOAD, self.name));
        let mut workload_events: EventStream<DynamicObject> =
            Box::pin(watcher::watcher(workloads, by_name).default_backoff());
        let mut pod_events: EventStream<Pod> =
            Box::pin(watcher::watcher(pods, by_label).default_backoff());
        let mut seen = Seen::default();
        let mut listed = false;
        let mut followed: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
        let ranks = self
            .spec
            .distributed
            .as_ref()
            .map(|d| d.workers)
            .unwrap_or(1);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let outcome = loop {
            tokio::select! {
                e = workload_events.next() => match e {
                    Some(Ok(Event::Apply(o))) => { seen.gone = false; seen.workload(&o) }
                    Some(Ok(Event::InitApply(o))) => { listed = true; seen.gone = false; seen.workload(&o) }
                    Some(Ok(Event::Delete(_))) => seen.gone = true,
                    Some(Ok(Event::Init)) => listed = false,
                    // A (re)list without the workload: it vanished.
                    Some(Ok(Event::InitDone)) => seen.gone |= !listed,
                    Some(Err(e)) => tracing::warn!("watching {} {}: {e}", self.kind, self.name),
                    None => break AttemptOutcome::Failed { exit_code: None, reason: "the watch of the workload ended".into() },
                },
                e = pod_events.next() => match e {
                    Some(Ok(Event::Apply(p) | Event::InitApply(p))) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        seen.pods.insert(name, p);
                    }
                    Some(Ok(Event::Delete(p))) => {
                        // The pod's last state still tells how it ended.
                        let name = p.metadata.name.clone().unwrap_or_default();
                        seen.pods.insert(name, p);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!("watching the pods of {}: {e}", self.name),
                    None => break AttemptOutcome::Failed { exit_code: None, reason: "the watch of the pods ended".into() },
                },
                _ = tick.tick() => {}
            }
            self.follow_started(&seen, &mut followed, &log, ranks);
            if let Some(o) = self.outcome(&mut seen) {
                break o;
            }
        };
        self.drain_logs(followed, &log, ranks).await;
        match outcome {
            AttemptOutcome::Failed { ref reason, .. }
                if !reason.starts_with("lost:") && seen.conditions.is_empty() =>
            {
                // Failed from its pods (unschedulable, image): the Job would hang; stop it.
                let _ = delete_workload(&self.client, &ns, &self.kind, &self.name).await;
            }
            // Its queue would run it again on its own: the engine submits the next
            // attempt instead, so this one goes.
            AttemptOutcome::Preempted { .. } => {
                let _ = delete_workload(&self.client, &ns, &self.kind, &self.name).await;
            }
            _ => {}
        }
        match self.take_snapshot(&outcome, &log).await {
            Some(failed) => failed,
            None => outcome,
        }
    }

    fn made(&self) -> Option<serde_json::Value> {
        self.made.clone()
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        if let Err(e) = delete_workload(
            &self.client,
            &self.settings.namespace,
            &self.kind,
            &self.name,
        )
        .await
        {
            tracing::warn!("cannot delete {} {}: {e}", self.kind, self.name);
        }
    }
}
