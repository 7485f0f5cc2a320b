//! The pipeline spec: exactly what the user wrote, as serde types.
//!
//! These types mirror the YAML one to one (`deny_unknown_fields`, `version: 1`) and carry
//! no meaning beyond shape: durations, quantities, cron expressions, templates and
//! references are kept as written and checked by [`crate::validate`], which turns a spec
//! into a [`crate::plan::Pipeline`]. The JSON Schema that editors use is generated from
//! these types ([`json_schema`]), and every field's doc comment is its documentation.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A pipeline file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The spec version. Only `1` exists.
    pub version: u32,
    /// The pipeline's name: a DNS-1123 label (lowercase letters, digits, `-`).
    pub name: String,
    /// Free text shown by `drivetrain plan` and the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The project its runs belong to (a DNS-1123 label; default `default`): who may see
    /// and start them (tokens are per project), its cache, quotas and Kueue queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Typed parameters, set with `--param name=value`, read as `{{ params.name }}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub params: IndexMap<String, ParamSpec>,
    /// Run this pipeline from cron (see `drivetrain serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    /// Run this pipeline when objects land under a store prefix (see `drivetrain serve`
    /// and `drivetrain trigger`), by trigger name.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub triggers: IndexMap<String, TriggerSpec>,
    /// Where to tell of this pipeline's runs: CloudEvents webhooks, Slack-compatible
    /// webhooks, e-mail (sent by `drivetrain serve`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<NotifySpec>,
    /// A duration (`2h`): a run still going this long after it started is told of as a
    /// missed deadline (`notify` event `deadline`), once; it keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Settings every stage inherits unless it sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<DefaultsSpec>,
    /// The artifact store URL: `file:///abs/path`, `memory://`, `s3://bucket/prefix`,
    /// `gs://…`, `az://…`. Default: `file://` under `.drivetrain/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The stages, by name. Order in the file is the tie-break for display order.
    pub stages: IndexMap<String, StageSpec>,
}

/// The top-level fields, in the order the spec reference lists them.
pub const PIPELINE_FIELDS: &[&str] = &[
    "version",
    "name",
    "description",
    "project",
    "params",
    "schedule",
    "triggers",
    "notify",
    "deadline",
    "defaults",
    "store",
    "stages",
];

/// A typed parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    /// `string`, `number`, `integer`, `boolean` or `list`. Inferred from `default` when
    /// omitted; one of the two is required.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ParamType>,
    /// The value when `--param` does not set one. A param without a default is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The allowed values, if restricted.
    #[serde(default, rename = "enum", skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<serde_json::Value>>,
}

/// The type of a param.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Number,
    Integer,
    Boolean,
    List,
}

impl ParamType {
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Number => "number",
            ParamType::Integer => "integer",
            ParamType::Boolean => "boolean",
            ParamType::List => "list",
        }
    }
}

/// A cron schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Five fields (`0 3 * * *`), or six with seconds first (`30 0 3 * * *`) with
    /// `seconds: true`.
    pub cron: String,
    /// The expression has six fields, seconds first. Said on purpose: `0 3 * * * *` (a
    /// nightly with a stray `*`) would fire hourly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seconds: bool,
    /// An IANA timezone (`Europe/Berlin`); default `UTC`. Daylight-saving changes follow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// What a tick does while an earlier run of this pipeline is still running.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// Which missed ticks run after downtime: `none`, `latest` or `all` (bounded by
    /// `max_catchup`).
    #[serde(default)]
    pub catchup: Catchup,
    /// The most missed ticks `catchup: all` runs. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_catchup: Option<u32>,
    /// A suspended schedule fires nothing; resuming does not fire the backlog.
    #[serde(default)]
    pub suspend: bool,
}

/// A trigger: what starts a run, how objects are batched into runs, and the params a
/// run gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerSpec {
    /// New objects under a store prefix (this or `after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<ObjectsSpec>,
    /// Runs of another pipeline ending (this or `objects`): each such run starts one run
    /// of this pipeline (`batch` can gather several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<AfterSpec>,
    /// Signed HTTP calls (`POST /api/v1/pipelines/NAME/triggers/TRIGGER` of `serve`),
    /// each with an `Idempotency-Key`: one object per key (this, `objects` or `after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<HookSpec>,
    /// How many objects one run takes, and how long the first may wait for more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchSpec>,
    /// The params a run gets, by param name: templates over `trigger.manifest` (the URL
    /// of a JSON file listing the batch's objects), `trigger.name`, `trigger.count`,
    /// `trigger.group`, `trigger.urls` (the objects' URLs, one per line), for `after`
    /// `trigger.run` (the first upstream run's id), and for `webhook` `trigger.body` (the
    /// first call's body).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub params: IndexMap<String, String>,
    /// A paused trigger keeps discovering objects and starts no run until resumed.
    #[serde(default)]
    pub paused: bool,
}

/// Where objects land and how they are discovered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectsSpec {
    /// A store prefix: `s3://bucket/prefix/`, `gs://…`, `az://…` or `file:///abs/dir/`.
    pub source: String,
    /// A glob over the key below the prefix (`*.mcap`, `veh*/**/*.mcap`); default: every
    /// object.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// An SQS queue URL that receives the bucket's event notifications: objects are
    /// seen within a second; the listing still runs, every `rescan`, as a safety net.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// How often new keys are listed (from the cursor on). Default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<String>,
    /// How often the whole prefix is listed again, for objects whose keys sort before
    /// the cursor or that a notification missed. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescan: Option<String>,
}

/// A trigger's webhook: callers sign the body with HMAC-SHA256 of this secret
/// (`X-Drivetrain-Signature: sha256=<hex>`); the API's bearer token is not asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// The environment variable of `serve` that holds the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// A file that holds the secret (its first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<String>,
}

/// Another pipeline's runs that start this one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AfterSpec {
    /// The upstream pipeline's name.
    pub pipeline: String,
    /// The phases of its runs that count: `succeeded`, `failed`, `error`, `cancelled`.
    /// Default `[succeeded]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase: Vec<NotifyEvent>,
}

/// How objects become runs: a run starts when `min_items` objects wait, or when the
/// oldest waiting one has waited `max_wait`, whichever comes first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Default 1: every object starts a run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_items: Option<u32>,
    /// The most objects one run takes. Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u32>,
    /// A duration (`6h`): a run starts with fewer than `min_items` once the oldest
    /// waiting object has waited this long. Default: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<String>,
    /// A template over `object.key`, `object.dir` and `object.name` (the key below the
    /// prefix, its directory and its file name): objects of different groups never
    /// share a run, e.g. `{{ object.dir }}` for one run per vehicle directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<String>,
}

/// One notification sink and the events it receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifySpec {
    /// The events: `started`, `succeeded`, `failed`, `error`, `cancelled`, `deadline`.
    /// Default: the four that end a run, and `deadline`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<NotifyEvent>,
    /// An HTTP endpoint that receives CloudEvents 1.0 (structured JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
    /// A Slack-compatible incoming webhook (`{"text": …}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackSpec>,
    /// E-mail over SMTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<EmailSpec>,
}

/// A run event a sink can receive.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NotifyEvent {
    Started,
    Succeeded,
    Failed,
    Error,
    Cancelled,
    /// The run, or a stage of it, passed its `deadline` and is still going.
    Deadline,
    /// The run waits for people: an approval stage asks for a decision.
    Waiting,
}

/// A CloudEvents webhook. The body is signed with HMAC-SHA256 of the secret, sent as
/// `X-Drivetrain-Signature: sha256=<hex>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    pub url: String,
    /// The environment variable of the engine that holds the signing secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// A file that holds the signing secret (its first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<String>,
}

/// A Slack-compatible incoming webhook: its URL is a secret, so it is named, never written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlackSpec {
    /// The environment variable that holds the webhook URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// A file that holds the webhook URL (its first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
}

/// E-mail over SMTP (plain or STARTTLS-less, as a relay on the host or a test sink).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailSpec {
    /// `smtp://host:port`.
    pub smtp: String,
    pub from: String,
    pub to: Vec<String>,
    /// The environment variable that holds `user:password` for SMTP AUTH PLAIN, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_env: Option<String>,
}

/// Concurrency policy of a schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// Start a new run regardless.
    #[default]
    Allow,
    /// Skip the tick while a run is in flight.
    Forbid,
    /// Cancel the run in flight and start the new one.
    Replace,
}

/// Catch-up policy of a schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Catchup {
    /// Missed ticks are dropped.
    None,
    /// Only the most recent missed tick runs.
    #[default]
    Latest,
    /// Every missed tick runs, oldest first, at most `max_catchup`.
    All,
}

/// Settings inherited by every stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DefaultsSpec {
    /// The container image of `uses:` stages and of `run:` stages that name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<RetrySpec>,
    /// A duration: `90s`, `15m`, `2h`, `1h30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// Environment for every stage; a stage's own `env` wins per variable.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<String, String>,
    /// `local` or `kubernetes`. Default `local`; `--executor` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// Queue, priority and preemption for every stage; a stage's own fields win one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
}

/// Where a stage waits for its GPUs and who goes first: locally a queue of the home's
/// ledger, on clusters the cluster's queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulingSpec {
    /// A queue's name (`default` when none): a DNS-1123 label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Higher goes first: an integer (default 0, from -1000000 to 1000000), or the name
    /// of a class (locally one of the home's, `drivetrain queue class NAME VALUE`; on
    /// Kubernetes a Kueue `WorkloadPriorityClass` or a `PriorityClass`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PrioritySpec>,
    /// Whether an attempt of higher priority that cannot be admitted may stop this one
    /// (default false); a preempted attempt resumes from its checkpoints when admitted
    /// again, not counted against `retries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
    /// A duration: how long a preempted attempt has between SIGTERM and SIGKILL (default
    /// `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
    /// Where on a cluster a gang's pods must (`require`) or should (`prefer`) be placed
    /// together: a topology level (Kueue's `podset-required-topology`, Volcano's
    /// `networkTopology`). One machine is within every level: ignored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySpec>,
}

/// A priority: a number, or a class's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PrioritySpec {
    Value(i64),
    Class(String),
}

/// A topology level the pods of a stage must or should share: exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<String>,
}

/// One stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A built-in step (`drivetrain validate --steps` lists them). Exactly one of `uses`
    /// and `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<String>,
    /// A command or container. Exactly one of `uses` and `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunSpec>,
    /// The step's configuration, checked against the step's own schema.
    #[serde(default, rename = "with", skip_serializing_if = "Option::is_none")]
    pub with: Option<serde_json::Value>,
    /// Stages that must succeed first. Inputs and `stages.X.values` references add
    /// their producers implicitly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
    /// Artifacts this stage reads: `name: stage.output`, or `{from: stage.output,
    /// optional: true}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub inputs: IndexMap<String, InputSpec>,
    /// Artifacts this stage writes: names, or `{name, mode}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputSpec>,
    /// A condition; the stage is skipped (and says why) when it is false. References
    /// without braces: `params.promote && stages.validate.values.passed == true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Fan-out: run this stage once per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapSpec>,
    /// A hyperparameter search: the stage runs as trials (each a set of params and a
    /// budget), adaptive (`asha`) or not (`grid`, `random`); its result is the best
    /// trial's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSpec>,
    /// Makes the stage wait for people instead of running anything: the run waits (no
    /// process, no slot) until enough people with the role approve, one rejects, or the
    /// timeout decides. The evidence shown is what its upstream stages (`needs`) left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalSpec>,
    /// Makes the stage a hook: it runs after every other stage has ended, `finally`
    /// always, `on_failure` only when the run failed (notifications, cleanup). No
    /// ordinary stage may depend on a hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<Hook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<RetrySpec>,
    /// A duration: `90s`, `15m`, `2h`, `1h30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// A duration: the stage still running this long after it started is told of as a
    /// missed deadline (`notify` event `deadline`), once; unlike `timeout` it is not
    /// stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<DistributedSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeSpec>,
    /// Snapshot a volume after the stage (Kubernetes CSI `VolumeSnapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotSpec>,
    /// Secret references (never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Environment variables; values may hold templates.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<String, String>,
    /// `host` (the default: the machine's network, or the pod's) or `none`: loopback
    /// only, in a network namespace of the stage's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Where the stage's job goes on a Slurm cluster (over the executor's settings);
    /// other executors ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSpec>,
    /// Queue, priority and preemption (over `defaults.scheduling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
}

/// A stage's place on a Slurm cluster: `sbatch`'s `--partition`, `--account`, `--qos`
/// and `--constraint`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Node features the job needs (`a100&ib`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
}

/// An approval stage: who decides, how many, and what a timeout means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSpec {
    pub approvers: ApproversSpec,
    /// A duration (`24h`): when it passes undecided, `on_timeout` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

/// Who decides an approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproversSpec {
    /// The approval role a decider holds in the run's project (`safety`).
    pub role: String,
    /// How many distinct people must approve (one rejection rejects).
    #[serde(default = "one")]
    pub min: u32,
}

fn one() -> u32 {
    1
}

/// What an approval's timeout decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    #[default]
    Reject,
    Approve,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Reject => "reject",
            OnTimeout::Approve => "approve",
        }
    }
}

/// A stage's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    Host,
    /// Loopback only: no other host, no service of the machine's.
    None,
}

/// A command, optionally in a container image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// The image on Kubernetes; default `defaults.image`. Ignored by the local executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// argv: a list, never a shell string. Each element may hold templates.
    pub command: Vec<String>,
    /// More argv elements appended to `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<String, String>,
    /// The working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// An input artifact reference.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum InputSpec {
    /// `stage.output`
    Short(String),
    Long(InputLong),
}

/// The long form of an input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputLong {
    /// `stage.output`
    pub from: String,
    /// When the producer is skipped, the input is absent instead of an error.
    #[serde(default)]
    pub optional: bool,
    /// `dir` (default: a local directory) or `url` (a store URL, for data too large to copy).
    #[serde(default)]
    pub mode: IoMode,
}

impl InputSpec {
    pub fn from(&self) -> &str {
        match self {
            InputSpec::Short(s) => s,
            InputSpec::Long(l) => &l.from,
        }
    }

    pub fn optional(&self) -> bool {
        matches!(self, InputSpec::Long(l) if l.optional)
    }

    pub fn mode(&self) -> IoMode {
        match self {
            InputSpec::Short(_) => IoMode::Dir,
            InputSpec::Long(l) => l.mode,
        }
    }
}

/// How a stage sees an artifact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    #[default]
    Dir,
    Url,
}

/// An output declaration.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OutputSpec {
    Short(String),
    Long(OutputLong),
}

/// The long form of an output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputLong {
    pub name: String,
    #[serde(default)]
    pub mode: IoMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl OutputSpec {
    pub fn name(&self) -> &str {
        match self {
            OutputSpec::Short(s) => s,
            OutputSpec::Long(l) => &l.name,
        }
    }

    pub fn mode(&self) -> IoMode {
        match self {
            OutputSpec::Short(_) => IoMode::Dir,
            OutputSpec::Long(l) => l.mode,
        }
    }
}

/// Implements `Deserialize` for a "string or mapping" type: the derived untagged form
/// would lose located errors, this keeps them.
macro_rules! string_or_struct {
    ($ty:ident, $long:ident, $what:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$ty, E> {
                        Ok($ty::Short(s.to_owned()))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<$ty, A::Error> {
                        $long::deserialize(de::value::MapAccessDeserializer::new(m)).map($ty::Long)
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

string_or_struct!(
    InputSpec,
    InputLong,
    "`stage.output` or a mapping with `from`"
);
string_or_struct!(
    OutputSpec,
    OutputLong,
    "an output name or a mapping with `name`"
);

/// When a hook stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// After the run, whatever happened.
    Finally,
    /// After the run, only if it failed.
    OnFailure,
}

/// Fan-out over items. Exactly one of `items`, `param` and `from`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MapSpec {
    /// A static list of items (scalars or mappings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<serde_json::Value>>,
    /// The name of a `list` param.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// `stage.output`: an upstream output whose `items.json` is a JSON list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// At most this many items run at once. Default: no limit beyond the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// The stage succeeds when at least this fraction of items succeeds (0 to 1).
    /// Default 1: every item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_success_ratio: Option<f64>,
}

/// A search over a stage's hyperparameters (Determined's `searcher:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSpec {
    /// `grid` (every point of the space), `random` (`max_trials` points drawn from it)
    /// or `asha` (random points, stopped early at rungs of a growing budget).
    pub method: SearchMethod,
    /// ASHA only: `promote` (a trial pauses at a rung; the best of a rung are resumed
    /// from their checkpoints to the next) or `stop` (a trial goes on at once unless it
    /// is below the rung's cut, when it is stopped). Default `promote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<SearchVariant>,
    /// The name of the value trials report that decides (`val_loss`).
    pub metric: String,
    /// Default `minimize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Goal>,
    /// How many trials to start (`random`, `asha`: required; `grid`: at most this many
    /// of the grid's points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<u32>,
    /// At most this many trials run at once (and never more than the run's parallelism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// More failed trials than this fail the stage (default: none may fail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed_trials: Option<u32>,
    /// The budget a trial trains to (`{{ trial.budget }}`): required by `asha`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// ASHA's divisor: a rung keeps the best 1/`reduction_factor` (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduction_factor: Option<u32>,
    /// ASHA's most rungs (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rungs: Option<u32>,
    /// The seed of the points drawn (default 0): the same seed draws the same trials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// A duration: a running trial that reports nothing for this long is stopped as
    /// `stale` (a failed trial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after: Option<String>,
    /// The hyperparameters: each `{uniform: [LO, HI]}`, `{log_uniform: [LO, HI]}`,
    /// `{int: [LO, HI]}` or `{choice: [V, …]}`.
    pub space: IndexMap<String, SpaceSpec>,
}

/// How a search chooses its trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SearchMethod {
    Grid,
    Random,
    Asha,
}

/// What ASHA does with a trial at a rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SearchVariant {
    Promote,
    Stop,
}

/// Whether a smaller or a larger metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    Minimize,
    Maximize,
}

/// A search's budget: what a trial counts (`epochs`) and the least and most of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// A word for what is counted (`epochs`, `steps`); default `steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    pub min: u64,
    pub max: u64,
}

/// One hyperparameter's values: exactly one of `uniform`, `log_uniform`, `int` and
/// `choice`. A grid takes `count` points of a continuous range.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpaceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uniform: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_uniform: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<[i64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<serde_json::Value>>,
    /// Grid points of a `uniform` or `log_uniform` range (its ends included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// Retry policy. The engine owns retries on every executor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Retries after the first attempt. `0` disables them.
    pub limit: u32,
    /// The first delay; it doubles each retry, with jitter. Default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// The longest delay. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff: Option<String>,
    /// Retry only on these exit codes or error classes (`error`, `timeout`, `lost`,
    /// `oom`, `failed`). Default: every failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<RetryOn>,
}

/// What a retry policy retries on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RetryOn {
    /// A process exit code.
    ExitCode(i32),
    Class(ErrorClass),
}

/// Classes of attempt failure, for `retries.on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorClass {
    /// Any non-zero exit of the stage's own code.
    Failed,
    /// An infrastructure fault: executor, store, Kubernetes API.
    Error,
    /// The stage ran past its timeout.
    Timeout,
    /// The attempt vanished (node lost, engine restarted and could not re-attach).
    Lost,
    /// Killed for exceeding its memory.
    Oom,
}

impl<'de> Deserialize<'de> for RetryOn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RetryOn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an exit code or one of `failed`, `error`, `timeout`, `lost`, `oom`")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RetryOn, E> {
                i32::try_from(v)
                    .map(RetryOn::ExitCode)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RetryOn, E> {
                i32::try_from(v)
                    .map(RetryOn::ExitCode)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RetryOn, E> {
                ErrorClass::deserialize(de::value::StrDeserializer::<E>::new(v)).map(RetryOn::Class)
            }
        }
        d.deserialize_any(V)
    }
}

/// Cache policy of a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// Default true for stages that declare outputs.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Entries older than this are misses: a duration (`7d`, `12h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// More components of the key, each a template (`"{{ run.date }}"`), added to the
    /// exact key, never replacing it. An entry `registry:MODEL@ALIAS` names what the
    /// stage reads from the model registry: the version the alias points at when the
    /// stage is about to run is part of the key, so moving the alias makes it a miss.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Compute resources, in Kubernetes quantity syntax (`2`, `500m`, `4Gi`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<QuantityText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<QuantityText>,
    /// Whole GPUs (`nvidia.com/gpu`); fractions are not schedulable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<QuantityText>,
    /// Shared memory: a memory-backed `/dev/shm` of this size (PyTorch data loaders, NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<QuantityText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<QuantityText>,
}

/// A quantity as written: `2`, `0.5`, `500m`, `4Gi`. Checked by validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QuantityText(pub String);

impl JsonSchema for QuantityText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "description": "A Kubernetes quantity: `2`, `500m`, `4Gi`, `1.5`.",
            "anyOf": [
                {"type": "string", "pattern": "^[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"},
                {"type": "number"}
            ]
        })
    }
}

/// Distributed execution of one stage across ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DistributedSpec {
    /// `none` (plain ranks with torchrun's environment), `indexed` (an Indexed Job),
    /// `mpi` (a Kubeflow MPIJob), `pytorch` (a Kubeflow PyTorchJob).
    #[serde(default)]
    pub framework: Framework,
    /// The number of workers (ranks), at least 1. All start together (gang semantics).
    pub workers: i64,
    /// MPI slots per worker. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_per_worker: Option<i64>,
}

/// How distributed ranks are launched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    #[default]
    None,
    Indexed,
    Mpi,
    Pytorch,
}

/// A volume mounted into the stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    /// The volume's name within the stage (a DNS-1123 label).
    pub name: String,
    /// The absolute mount path.
    pub mount_path: String,
    /// A PersistentVolumeClaim. Exactly one of `claim`, `empty_dir`, `from_snapshot` and
    /// `host_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// A path of the machine the stage runs on (an absolute path), bound at `mount_path`
    /// as Docker's `-v HOST:MOUNT` does: the local executor's volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// A scratch volume of this size limit (a quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<QuantityText>,
    /// A new claim restored from this `VolumeSnapshot` (reruns on a dataset version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// The size of the claim restored with `from_snapshot` (a quantity, at least the
    /// snapshot's restore size). Required with `from_snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<QuantityText>,
    #[serde(default)]
    pub read_only: bool,
}

/// A snapshot of one of the stage's volumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSpec {
    /// The name of a volume of this stage.
    pub volume: String,
    /// `success` (default) or `always`.
    #[serde(default)]
    pub when: SnapshotWhen,
    /// The `VolumeSnapshotClass`; default: the cluster's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// When a volume snapshot is taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotWhen {
    #[default]
    Success,
    Always,
}

/// A reference to a secret; the value never appears in the spec or the logs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The Kubernetes Secret's name (locally: the environment variable
    /// `DRIVETRAIN_SECRET_<NAME>_<KEY>` of the engine, or the file `HOME/secrets/NAME/KEY`).
    pub name: String,
    /// The key within the secret. Required with `env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Expose the key as this environment variable. Exactly one of `env` and `mount_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Mount the whole secret as files here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
}

/// A Kubernetes toleration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: TolerationOperator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// A toleration's operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TolerationOperator {
    #[default]
    Equal,
    Exists,
}

/// A taint effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// The JSON Schema of a pipeline file, for editors (`# yaml-language-server: $schema=…`).
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<PipelineSpec>();
    let mut value = serde_json::to_value(schema).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("title".into(), "drivetrain pipeline".into());
    }
    value
}

/// The JSON Schema of a pipeline file with each step's `with:` typed: `steps` holds, for
/// each step, the `uses:` values that name it and the schema of its `with:` (built-in
/// steps' config schemas, plugins' params).
pub fn json_schema_with(steps: &[(Vec<String>, serde_json::Value)]) -> serde_json::Value {
    let mut value = json_schema();
    let conditions: Vec<serde_json::Value> = steps
        .iter()
        .map(|(uses, with)| {
            serde_json::json!({
                "if": {"properties": {"uses": {"enum": uses}}, "required": ["uses"]},
                "then": {"properties": {"with": with}},
            })
        })
        .collect();
    if let Some(stage) = value.pointer_mut("/definitions/StageSpec") {
        if !conditions.is_empty() {
            stage["allOf"] = serde_json::Value::Array(conditions);
        }
    }
    value
}
