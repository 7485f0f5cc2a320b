//! Renders a stage attempt into the Kubernetes objects that run it: typed k8s-openapi
//! objects for built-in kinds (Job, Service, PersistentVolumeClaim), and
//! [`DynamicObject`]s for the custom resources (Kubeflow `MPIJob` and `PyTorchJob`,
//! Volcano `PodGroup`, CSI `VolumeSnapshot`), whose pod templates are typed too.

use std::collections::BTreeMap;

use drivetrain_engine::artifacts::AttemptKey;
use drivetrain_engine::executor::{AttemptSpec, Rank, REMOTE_BINARY, REMOTE_WRAPPER};
use drivetrain_engine::plan::{Distributed, Priority, Scheduling};
use drivetrain_engine::spec::{Framework, TaintEffect, TolerationOperator};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, LocalObjectReference,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    SecretKeySelector, SecretVolumeSource, Service, ServiceSpec, Toleration as KToleration,
    TypedLocalObjectReference, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use super::{Gang, Settings};

/// The label keys every object carries.
pub const LABEL_PIPELINE: &str = "drivetrain.dev/pipeline";
pub const LABEL_RUN: &str = "drivetrain.dev/run";
pub const LABEL_STAGE: &str = "drivetrain.dev/stage";
pub const LABEL_ATTEMPT: &str = "drivetrain.dev/attempt";
pub const LABEL_ITEM: &str = "drivetrain.dev/item";
/// Selects the pods of one workload (the headless Service's selector).
pub const LABEL_WORKLOAD: &str = "drivetrain.dev/workload";
/// The run's project, on every object.
pub const LABEL_PROJECT: &str = "drivetrain.dev/project";
/// The main container's name (`pytorch` for a PyTorchJob, which requires it).
pub const MAIN: &str = "main";

/// One object to create.
#[derive(Debug, Clone)]
pub enum Object {
    Job(Box<Job>),
    Service(Box<Service>),
    Claim(Box<PersistentVolumeClaim>),
    Custom(Box<DynamicObject>, ApiResource),
}

impl Object {
    pub fn kind(&self) -> &str {
        match self {
            Object::Job(_) => "Job",
            Object::Service(_) => "Service",
            Object::Claim(_) => "PersistentVolumeClaim",
            Object::Custom(_, ar) => &ar.kind,
        }
    }

    pub fn name(&self) -> String {
        let meta = match self {
            Object::Job(j) => &j.metadata,
            Object::Service(s) => &s.metadata,
            Object::Claim(c) => &c.metadata,
            Object::Custom(d, _) => &d.metadata,
        };
        meta.name.clone().unwrap_or_default()
    }

    /// The object as JSON, with `apiVersion` and `kind`.
    pub fn to_value(&self) -> serde_json::Value {
        let value = match self {
            Object::Job(j) => serde_json::to_value(j),
            Object::Service(s) => serde_json::to_value(s),
            Object::Claim(c) => serde_json::to_value(c),
            Object::Custom(d, _) => serde_json::to_value(d),
        };
        value.unwrap_or_default()
    }
}

/// What one attempt creates, in creation order; the last object is the workload whose
/// status says how the attempt ended.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub objects: Vec<Object>,
    /// The workload's kind and name: `Job`, `MPIJob` or `PyTorchJob`.
    pub workload: (String, String),
}

/// The custom resources drivetrain renders.
pub fn mpijob_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v2beta1", "MPIJob"),
        "mpijobs",
    )
}

pub fn pytorchjob_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v1", "PyTorchJob"),
        "pytorchjobs",
    )
}

pub fn podgroup_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        "podgroups",
    )
}

pub fn volumesnapshot_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// A DNS-1123 label from free text: lowercase alphanumerics and `-`, at most `max`
/// characters, starting and ending alphanumeric.
pub fn dns_label(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    out.truncate(max);
    let trimmed = out.trim_matches('-');
    if trimmed.is_empty() {
        "x".into()
    } else {
        trimmed.to_owned()
    }
}

/// A label value: at most 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
pub fn label_value(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(63);
    out.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())[..8].to_owned()
}

/// The workload's name: deterministic from (run, stage, attempt, item), so a creation
/// re-submitted after a crash answers `AlreadyExists` instead of starting a second Job.
/// At most 52 characters, so the pods' hostnames (`<name>-<index>`) and the Kubeflow
/// replicas' names (`<name>-worker-<i>`) stay within 63.
pub fn workload_name(run: &str, stage_key: &str, attempt: u32) -> String {
    let key = AttemptKey::from_stage_key(run, stage_key, attempt);
    let item = key.item.map(|i| format!("-i{i}")).unwrap_or_default();
    let hash = short_hash(&[run, stage_key, &attempt.to_string()]);
    let tail = format!("{item}-a{attempt}-{hash}");
    let room = 52usize.saturating_sub(3 + tail.len());
    format!("dt-{}{tail}", dns_label(&key.stage, room.max(1)))
}

/// The name of the snapshot of `volume` taken after `stage` of `run`.
pub fn snapshot_name(run: &str, stage: &str, volume: &str) -> String {
    let hash = short_hash(&[run, stage, volume]);
    format!(
        "dt-{}-{}-{hash}",
        dns_label(stage, 24),
        dns_label(volume, 20)
    )
}

fn labels(settings: &Settings, spec: &AttemptSpec, workload: &str) -> BTreeMap<String, String> {
    let mut l = settings.labels.clone();
    l.insert("app.kubernetes.io/managed-by".into(), "drivetrain".into());
    l.insert(LABEL_PIPELINE.into(), label_value(&spec.placement.pipeline));
    l.insert(LABEL_RUN.into(), label_value(&spec.run_id));
    l.insert(LABEL_PROJECT.into(), label_value(project(spec)));
    let stage = spec.stage.split('/').next().unwrap_or(&spec.stage);
    l.insert(LABEL_STAGE.into(), label_value(stage));
    l.insert(LABEL_ATTEMPT.into(), spec.attempt.to_string());
    if let Some(i) = spec.placement.item {
        l.insert(LABEL_ITEM.into(), i.to_string());
    }
    l.insert(LABEL_WORKLOAD.into(), workload.to_owned());
    l
}

/// The run's project (`default` where the spec names none).
fn project(spec: &AttemptSpec) -> &str {
    match spec.placement.project.as_str() {
        "" => drivetrain_engine::access::DEFAULT_PROJECT,
        p => p,
    }
}

fn meta(name: &str, settings: &Settings, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(settings.namespace.clone()),
        labels: Some(labels.clone()),
        ..Default::default()
    }
}

fn q(text: impl Into<String>) -> Quantity {
    Quantity(text.into())
}

/// Everything about the pod but its container's command: shared by Jobs and Kubeflow
/// replicas.
struct PodParts {
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    init: Vec<Container>,
    claims: Vec<PersistentVolumeClaim>,
}

fn pod_parts(
    settings: &Settings,
    spec: &AttemptSpec,
    workload: &str,
    labels: &BTreeMap<String, String>,
) -> PodParts {
    let root = settings.root.display().to_string();
    let mut volumes = vec![Volume {
        name: "drivetrain".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "drivetrain".into(),
        mount_path: root.clone(),
        ..Default::default()
    }];
    let mut claims = Vec::new();
    if let Some(shm) = &spec.placement.resources.shm {
        volumes.push(Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(q(shm.text.clone())),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "dshm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        });
    }
    for v in &spec.placement.volumes {
        let name = format!("v-{}", dns_label(&v.name, 60));
        let mut volume = Volume {
            name: name.clone(),
            ..Default::default()
        };
        if let Some(claim) = &v.claim {
            volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(v.read_only),
            });
        } else if let Some(size) = &v.empty_dir {
            volume.empty_dir = Some(EmptyDirVolumeSource {
                size_limit: Some(q(size.0.clone())),
                ..Default::default()
            });
        } else if let Some(snapshot) = &v.from_snapshot {
            let claim = restored_claim_name(workload, &v.name);
            claims.push(restored_claim(&claim, snapshot, v, settings, labels));
            volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: Some(v.read_only),
            });
        }
        volumes.push(volume);
        mounts.push(VolumeMount {
            name,
            mount_path: v.mount_path.clone(),
            read_only: v.read_only.then_some(true),
            ..Default::default()
        });
    }
    let mut mounted = std::collections::BTreeSet::new();
    for s in spec.placement.secrets.iter() {
        let Some(path) = &s.mount_path else { continue };
        let name = format!("s-{}", dns_label(&s.name, 60));
        if mounted.insert(name.clone()) {
            volumes.push(Volume {
                name: name.clone(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(s.name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        mounts.push(VolumeMount {
            name,
            mount_path: path.clone(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let init = vec![Container {
        name: "drivetrain-wrapper".into(),
        image: Some(settings.wrapper_image.clone()),
        command: Some(Wrapper::of(settings, spec).install),
        volume_mounts: Some(vec![VolumeMount {
            name: "drivetrain".into(),
            mount_path: root,
            ..Default::default()
        }]),
        ..Default::default()
    }];
    PodParts {
        volumes,
        mounts,
        init,
        claims,
    }
}

/// The claim `claim` that volume `v` is restored into from `snapshot` (a CSI
/// `VolumeSnapshot`), of the volume's size.
fn restored_claim(
    claim: &str,
    snapshot: &str,
    v: &drivetrain_engine::spec::VolumeSpec,
    settings: &Settings,
    labels: &BTreeMap<String, String>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(claim, settings, labels),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            data_source: Some(TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: snapshot.to_owned(),
            }),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".into(),
                    q(v.size.as_ref().map(|s| s.0.clone()).unwrap_or_default()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The claim a `from_snapshot` volume of `workload` is restored into.
pub fn restored_claim_name(workload: &str, volume: &str) -> String {
    format!("{workload}-{}", dns_label(volume, 10))
}

fn resources(spec: &AttemptSpec) -> Option<ResourceRequirements> {
    let r = &spec.placement.resources;
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if let Some(cpu) = &r.cpu {
        requests.insert("cpu".to_owned(), q(cpu.text.clone()));
    }
    if let Some(mem) = &r.memory {
        requests.insert("memory".to_owned(), q(mem.text.clone()));
        limits.insert("memory".to_owned(), q(mem.text.clone()));
    }
    if let Some(e) = &r.ephemeral_storage {
        requests.insert("ephemeral-storage".to_owned(), q(e.text.clone()));
    }
    // Extended resources are requested through limits (requests must equal them).
    if let Some(gpu) = r.gpu.filter(|g| *g > 0) {
        requests.insert("nvidia.com/gpu".to_owned(), q(gpu.to_string()));
        limits.insert("nvidia.com/gpu".to_owned(), q(gpu.to_string()));
    }
    if requests.is_empty() && limits.is_empty() {
        return None;
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    })
}

fn plain(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn env(spec: &AttemptSpec) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = spec.env.iter().map(|(k, v)| plain(k, v.clone())).collect();
    // Secret values never pass through the engine: the kubelet reads them.
    for s in &spec.placement.secrets {
        if let (Some(var), Some(key)) = (&s.env, &s.key) {
            env.push(EnvVar {
                name: var.clone(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: s.name.clone(),
                        key: key.clone(),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    env
}

fn main_container(
    settings: &Settings,
    spec: &AttemptSpec,
    parts: &PodParts,
    name: &str,
    command: Option<Vec<String>>,
    extra_env: Vec<EnvVar>,
) -> Container {
    let mut env = env(spec);
    env.extend(extra_env);
    Container {
        name: name.into(),
        image: Some(
            spec.placement
                .image
                .clone()
                .unwrap_or_else(|| settings.wrapper_image.clone()),
        ),
        command,
        env: Some(env),
        working_dir: (!spec.workdir.as_os_str().is_empty())
            .then(|| spec.workdir.display().to_string()),
        resources: resources(spec),
        volume_mounts: Some(parts.mounts.clone()),
        ..Default::default()
    }
}

/// The wrapper a pod's command runs under, and the init container's command that puts
/// it into the pod: the small `drivetrain-exec` (`wrapper_path`), or the whole binary
/// (`binary_path`) where the command is that binary (a built-in step), since the pod
/// needs it then anyway.
struct Wrapper {
    install: Vec<String>,
    run: Vec<String>,
}

impl Wrapper {
    fn of(settings: &Settings, spec: &AttemptSpec) -> Wrapper {
        let bin = settings.root.join("bin").display().to_string();
        let binary = settings.root.join(REMOTE_BINARY).display().to_string();
        if spec.argv.first() == Some(&binary) {
            Wrapper {
                install: vec![
                    settings.binary_path.clone(),
                    "exec".into(),
                    "--install".into(),
                    bin,
                ],
                run: vec![binary, "exec".into(), "--".into()],
            }
        } else {
            Wrapper {
                install: vec![settings.wrapper_path.clone(), "--install".into(), bin],
                run: vec![
                    settings.root.join(REMOTE_WRAPPER).display().to_string(),
                    "--".into(),
                ],
            }
        }
    }
}

/// `ROOT/bin/drivetrain-exec -- argv…` (or the whole binary's `exec`: [`Wrapper`]).
fn wrapped(settings: &Settings, spec: &AttemptSpec, argv: &[String]) -> Vec<String> {
    let mut c = Wrapper::of(settings, spec).run;
    c.extend(argv.iter().cloned());
    c
}

fn pod_spec(
    settings: &Settings,
    spec: &AttemptSpec,
    parts: &PodParts,
    container: Container,
) -> PodSpec {
    let mut node_selector = settings.node_selector.clone();
    node_selector.extend(spec.placement.node_selector.clone());
    let mut tolerations = settings.tolerations.clone();
    tolerations.extend(spec.placement.tolerations.iter().map(|t| {
        KToleration {
            key: t.key.clone(),
            operator: Some(
                match t.operator {
                    TolerationOperator::Equal => "Equal",
                    TolerationOperator::Exists => "Exists",
                }
                .into(),
            ),
            value: t.value.clone(),
            effect: t.effect.map(|e| {
                match e {
                    TaintEffect::NoSchedule => "NoSchedule",
                    TaintEffect::PreferNoSchedule => "PreferNoSchedule",
                    TaintEffect::NoExecute => "NoExecute",
                }
                .into()
            }),
            toleration_seconds: t.toleration_seconds,
        }
    }));
    PodSpec {
        restart_policy: Some("Never".into()),
        service_account_name: settings.service_account.clone(),
        image_pull_secrets: (!settings.image_pull_secrets.is_empty()).then(|| {
            settings
                .image_pull_secrets
                .iter()
                .map(|n| LocalObjectReference { name: n.clone() })
                .collect()
        }),
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        init_containers: Some(parts.init.clone()),
        containers: vec![container],
        volumes: Some(parts.volumes.clone()),
        scheduler_name: matches!(settings.gang, Some(Gang::Volcano { .. }))
            .then(|| "volcano".into()),
        // Kueue reads the workload's class from its label; the others, the pod's.
        priority_class_name: (!uses_kueue(settings))
            .then(|| priority_class(settings, &spec.placement.scheduling))
            .flatten(),
        ..Default::default()
    }
}

fn deadline(spec: &AttemptSpec) -> Option<i64> {
    spec.placement
        .timeout
        .map(|t| i64::try_from(t.as_secs().max(1)).unwrap_or(i64::MAX))
}

/// Whether workloads go to Kueue's queues.
fn uses_kueue(settings: &Settings) -> bool {
    settings.project_queues || matches!(settings.gang, Some(Gang::Kueue { .. }))
}

/// The class of a stage's priority on the cluster: the one it names, else the settings'
/// `preemptible_class` for a preemptible stage. (An integer priority orders only the
/// home's own GPU queue: `validate` warns of it.)
fn priority_class(settings: &Settings, sched: &Scheduling) -> Option<String> {
    match &sched.priority {
        Priority::Class(c) => Some(c.clone()),
        Priority::Value(_) if sched.preemptible => Some(settings.preemptible_class.clone()),
        Priority::Value(_) => None,
    }
}

/// A Volcano `PodGroup`'s spec: its gang, queue (the stage's over the settings'), class
/// and network topology.
fn volcano_group(settings: &Settings, sched: &Scheduling, members: u32, queue: &str) -> Value {
    let mut spec = json!({
        "minMember": members,
        "queue": sched.queue.as_deref().unwrap_or(queue),
    });
    if let Some(class) = priority_class(settings, sched) {
        spec["priorityClassName"] = json!(class);
    }
    if let Some(t) = &sched.topology {
        spec["networkTopology"] = json!({
            "mode": if t.required { "hard" } else { "soft" },
            "highestTierName": t.level,
        });
    }
    spec
}

/// Renders the objects of one attempt.
pub fn render(settings: &Settings, spec: &AttemptSpec) -> Rendered {
    let name = workload_name(&spec.run_id, &spec.stage, spec.attempt);
    let labels = labels(settings, spec, &name);
    let parts = pod_parts(settings, spec, &name, &labels);
    let mut objects: Vec<Object> = parts
        .claims
        .iter()
        .cloned()
        .map(|c| Object::Claim(Box::new(c)))
        .collect();
    let mut annotations = BTreeMap::new();
    let workers = spec.distributed.as_ref().map(|d| d.workers).unwrap_or(1);
    let sched = &spec.placement.scheduling;
    if let Some(Gang::Volcano { queue }) = &settings.gang {
        annotations.insert("scheduling.k8s.io/group-name".to_owned(), name.clone());
        let members = match spec.distributed.as_ref().map(|d| d.framework) {
            Some(Framework::Mpi) => workers + 1,
            _ => workers,
        };
        let mut pg = DynamicObject::new(&name, &podgroup_resource()).within(&settings.namespace);
        pg.metadata.labels = Some(labels.clone());
        pg.data = json!({"spec": volcano_group(settings, sched, members, queue)});
        objects.push(Object::Custom(Box::new(pg), podgroup_resource()));
        if sched.preemptible {
            annotations.insert("volcano.sh/preemptable".to_owned(), "true".to_owned());
        }
    }
    let kueue = match &settings.gang {
        _ if sched.queue.is_some() && uses_kueue(settings) => sched.queue.clone(),
        _ if settings.project_queues => Some(label_value(project(spec))),
        Some(Gang::Kueue { queue }) => Some(queue.clone()),
        _ => None,
    };
    let mut workload_labels = labels.clone();
    if let Some(queue) = &kueue {
        workload_labels.insert("kueue.x-k8s.io/queue-name".into(), queue.clone());
        if let Some(class) = priority_class(settings, sched) {
            workload_labels.insert("kueue.x-k8s.io/priority-class".into(), class);
        }
        if let Some(t) = &sched.topology {
            let key = match t.required {
                true => "kueue.x-k8s.io/podset-required-topology",
                false => "kueue.x-k8s.io/podset-preferred-topology",
            };
            annotations.insert(key.to_owned(), t.level.clone());
        }
    }
    let w = Workload {
        settings,
        spec,
        name,
        labels,
        workload_labels,
        parts,
        annotations,
        suspended: kueue.is_some(),
    };
    let kind = match spec.distributed.as_ref() {
        Some(Distributed {
            framework: Framework::Mpi,
            workers,
            slots_per_worker,
        }) => w.mpijob(&mut objects, *workers, *slots_per_worker),
        Some(Distributed {
            framework: Framework::Pytorch,
            workers,
            ..
        }) => w.pytorchjob(&mut objects, *workers),
        distributed => w.job(&mut objects, distributed),
    };
    Rendered {
        objects,
        workload: (kind.into(), w.name),
    }
}

/// What every object of one attempt's workload shares.
struct Workload<'a> {
    settings: &'a Settings,
    spec: &'a AttemptSpec,
    name: String,
    /// The pods' labels.
    labels: BTreeMap<String, String>,
    /// The workload's own: the pods' and Kueue's queue.
    workload_labels: BTreeMap<String, String>,
    parts: PodParts,
    annotations: BTreeMap<String, String>,
    /// Created suspended: Kueue admits it.
    suspended: bool,
}

impl Workload<'_> {
    fn template(&self, container: Container, labels: &BTreeMap<String, String>) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                ..Default::default()
            }),
            spec: Some(pod_spec(self.settings, self.spec, &self.parts, container)),
        }
    }

    /// The Kubeflow training operator's `runPolicy`.
    fn run_policy(&self) -> serde_json::Value {
        let mut run_policy = json!({
            "backoffLimit": 0,
            "cleanPodPolicy": "Running",
            "suspend": self.suspended,
        });
        if let Some(d) = deadline(self.spec) {
            run_policy["activeDeadlineSeconds"] = json!(d);
        }
        if let Some(ttl) = self.settings.ttl_seconds_after_finished {
            run_policy["ttlSecondsAfterFinished"] = json!(ttl);
        }
        run_policy
    }

    /// An MPIJob: a launcher that runs `mpirun` (under the wrapper) over the workers.
    fn mpijob(
        &self,
        objects: &mut Vec<Object>,
        workers: u32,
        slots_per_worker: u32,
    ) -> &'static str {
        let (settings, spec, name) = (self.settings, self.spec, &self.name);
        let ranks = (workers * slots_per_worker).to_string();
        let mut mpirun = vec![
            "mpirun".to_owned(),
            "--allow-run-as-root".into(),
            "-np".into(),
            ranks,
            "-bind-to".into(),
            "none".into(),
            "-map-by".into(),
            "slot".into(),
        ];
        mpirun.extend(
            spec.env
                .iter()
                .flat_map(|(k, _)| ["-x".to_owned(), k.clone()]),
        );
        mpirun.extend(spec.argv.iter().cloned());
        // The launcher only starts the ranks: no GPU, no share of the workers' memory.
        let mut launcher_spec = spec.clone();
        launcher_spec.placement.resources = Default::default();
        let launcher = main_container(
            settings,
            &launcher_spec,
            &self.parts,
            MAIN,
            Some(wrapped(settings, spec, &mpirun)),
            Vec::new(),
        );
        let mut launcher = self.template(launcher, &self.labels);
        if let Some(s) = launcher.spec.as_mut() {
            s.init_containers = Some(self.parts.init.clone());
        }
        // Workers run the image's own entrypoint (its SSH server), started by the
        // launcher's mpirun.
        let worker = main_container(settings, spec, &self.parts, MAIN, None, Vec::new());
        let mut worker = self.template(worker, &self.labels);
        if let Some(s) = worker.spec.as_mut() {
            s.init_containers = None;
        }
        let mut job = DynamicObject::new(name, &mpijob_resource()).within(&settings.namespace);
        job.metadata.labels = Some(self.workload_labels.clone());
        job.data = json!({"spec": {
            "slotsPerWorker": slots_per_worker,
            "runPolicy": self.run_policy(),
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": workers, "restartPolicy": "Never", "template": worker},
            },
        }});
        objects.push(Object::Custom(Box::new(job), mpijob_resource()));
        "MPIJob"
    }

    /// A PyTorchJob: a master and `workers - 1` workers, each under the wrapper.
    fn pytorchjob(&self, objects: &mut Vec<Object>, workers: u32) -> &'static str {
        let (settings, spec, name) = (self.settings, self.spec, &self.name);
        let container = main_container(
            settings,
            spec,
            &self.parts,
            "pytorch",
            Some(wrapped(settings, spec, &spec.argv)),
            Vec::new(),
        );
        let pod = self.template(container, &self.labels);
        let mut replicas = serde_json::Map::new();
        replicas.insert(
            "Master".into(),
            json!({"replicas": 1, "restartPolicy": "Never", "template": pod}),
        );
        if workers > 1 {
            replicas.insert(
                "Worker".into(),
                json!({"replicas": workers - 1, "restartPolicy": "Never", "template": pod}),
            );
        }
        let mut job = DynamicObject::new(name, &pytorchjob_resource()).within(&settings.namespace);
        job.metadata.labels = Some(self.workload_labels.clone());
        job.data =
            json!({"spec": {"runPolicy": self.run_policy(), "pytorchReplicaSpecs": replicas}});
        objects.push(Object::Custom(Box::new(job), pytorchjob_resource()));
        "PyTorchJob"
    }

    /// A batch Job: one pod, or (for plain ranks and Indexed Jobs) an Indexed Job with a
    /// headless Service, rank 0's stable DNS name as the rendezvous address.
    fn job(&self, objects: &mut Vec<Object>, distributed: Option<&Distributed>) -> &'static str {
        let (settings, spec, name) = (self.settings, self.spec, &self.name);
        let workers = distributed.map(|d| d.workers).unwrap_or(1);
        // Plain ranks and Indexed Jobs: one Indexed Job with a headless Service, rank
        // 0's stable DNS name as the rendezvous address.
        let indexed =
            distributed.is_some_and(|d| d.workers > 1 || d.framework == Framework::Indexed);
        let mut extra = Vec::new();
        if indexed {
            // One pod per node, one process per pod: the Job's completion index is the
            // rank and the node.
            let index = || EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                        .into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            for var in ["RANK", "GROUP_RANK", "ROLE_RANK", "NODE_RANK"] {
                extra.push(EnvVar {
                    name: var.into(),
                    value_from: Some(index()),
                    ..Default::default()
                });
            }
            for var in ["WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE"] {
                extra.push(plain(var, workers.to_string()));
            }
            extra.push(plain("LOCAL_RANK", "0"));
            extra.push(plain("LOCAL_WORLD_SIZE", "1"));
            extra.push(plain("MASTER_ADDR", format!("{name}-0.{name}")));
            extra.push(plain("MASTER_PORT", settings.master_port.to_string()));
            let service = Service {
                metadata: meta(name, settings, &self.labels),
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".into()),
                    selector: Some(BTreeMap::from([(LABEL_WORKLOAD.to_owned(), name.clone())])),
                    publish_not_ready_addresses: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            };
            objects.push(Object::Service(Box::new(service)));
        } else {
            // A world of one, rendezvous on the pod's own loopback: a single-process
            // `torch.distributed` job starts as it does locally.
            extra.extend(
                Rank::ALONE
                    .env("127.0.0.1", settings.master_port, Framework::None)
                    .into_iter()
                    .map(|(k, v)| plain(k, v)),
            );
        }
        let container = main_container(
            settings,
            spec,
            &self.parts,
            MAIN,
            Some(wrapped(settings, spec, &spec.argv)),
            extra,
        );
        let mut pod = self.template(container, &self.labels);
        if indexed {
            if let Some(s) = pod.spec.as_mut() {
                s.subdomain = Some(name.clone());
            }
        }
        let job = Job {
            metadata: meta(name, settings, &self.workload_labels),
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: deadline(spec),
                ttl_seconds_after_finished: settings.ttl_seconds_after_finished,
                completions: indexed.then_some(workers as i32),
                parallelism: indexed.then_some(workers as i32),
                completion_mode: indexed.then(|| "Indexed".into()),
                suspend: self.suspended.then_some(true),
                template: pod,
                ..Default::default()
            }),
            ..Default::default()
        };
        objects.push(Object::Job(Box::new(job)));
        "Job"
    }
}

/// The `VolumeSnapshot` taken after an attempt, if the stage asks for one: of the claim
/// behind the named volume.
pub fn snapshot(settings: &Settings, spec: &AttemptSpec) -> Option<DynamicObject> {
    let snap = spec.placement.snapshot.as_ref()?;
    let volume = spec
        .placement
        .volumes
        .iter()
        .find(|v| v.name == snap.volume)?;
    let workload = workload_name(&spec.run_id, &spec.stage, spec.attempt);
    let claim = match (&volume.claim, &volume.from_snapshot) {
        (Some(c), _) => c.clone(),
        (None, Some(_)) => restored_claim_name(&workload, &volume.name),
        (None, None) => return None,
    };
    let stage = spec.stage.split('/').next().unwrap_or(&spec.stage);
    let name = snapshot_name(&spec.run_id, stage, &volume.name);
    let mut labels = labels(settings, spec, &workload);
    labels.remove(LABEL_WORKLOAD);
    let mut obj = DynamicObject::new(&name, &volumesnapshot_resource()).within(&settings.namespace);
    obj.metadata.labels = Some(labels);
    let mut source = json!({"source": {"persistentVolumeClaimName": claim}});
    if let Some(class) = &snap.class {
        source["volumeSnapshotClassName"] = json!(class);
    }
    obj.data = json!({ "spec": source });
    Some(obj)
}
