//! The command line: every command, its flags and its help text (clap).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// The workflow engine for the autonomous-driving data loop.
#[derive(Debug, Parser)]
#[command(
    name = "drivetrain",
    version,
    about,
    long_about = None,
    after_help = "Exit status, for every command: 0 success; 1 a failure (a run that failed, a file \
                  that does not validate, a store that failed); 2 a usage error (a wrong flag or \
                  argument, or a run, stage, schedule or file that does not exist); 3 a run \
                  that waits for people (an approval stage); 130 a run that was cancelled."
)]
pub(crate) struct Cli {
    /// The engine's home (state, artifacts, attempt directories); default: `.drivetrain/`
    /// in the current directory or a parent. Also `DRIVETRAIN_HOME`.
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) home: Option<PathBuf>,
    /// The artifact store for this command (`file:///…`, `s3://bucket/prefix`, `gs://…`,
    /// `az://…`), over `DRIVETRAIN_STORE` and the pipeline's `store:`.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// The state store for this command (`postgres://user@host:port/db`), over
    /// `DRIVETRAIN_STATE`; default SQLite in the home.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) state: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    #[command(flatten)]
    Pipeline(PipelineGroup),
    #[command(flatten)]
    Run(RunGroup),
    #[command(flatten)]
    History(HistoryGroup),
    #[command(flatten)]
    Inspect(InspectGroup),
    #[command(flatten)]
    People(PeopleGroup),
    #[command(flatten)]
    Server(ServerGroup),
    #[command(flatten)]
    Experiments(ExperimentGroup),
}

/// Commands of searches: their trials, their rungs before a run, what a trial reports,
/// and runs side by side.
#[derive(Debug, Subcommand)]
pub(crate) enum ExperimentGroup {
    /// List a search stage's trials: id, params, state, the budget used, the best value
    /// of the search's metric, and timing.
    #[command(
        after_help = "Examples:\n  drivetrain trials 20261122-031500-1a2b train\n  drivetrain trials @latest train -o json"
    )]
    Trials {
        run: String,
        stage: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// What a search stage will run, before running it.
    #[command(subcommand)]
    Search(SearchCommand),
    /// Inside a trial: record metrics at a step (appended to `$DRIVETRAIN_METRICS`).
    #[command(after_help = "Example:\n  drivetrain report --step 3 val_loss=0.41 accuracy=0.87")]
    Report {
        /// The step (epoch, iteration) the values are at.
        #[arg(long)]
        step: Option<i64>,
        /// `NAME=VALUE`, each value a number.
        #[arg(required = true)]
        values: Vec<String>,
    },
    /// Two to five runs side by side: params, stages' values and searches' best trials;
    /// only the rows that differ unless `--all`.
    #[command(
        after_help = "Example:\n  drivetrain compare 20261122-031500-1a2b 20261123-031500-9f8e"
    )]
    Compare {
        #[arg(num_args = 2..=5, required = true)]
        runs: Vec<String>,
        /// Every row, also those the runs share.
        #[arg(long)]
        all: bool,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
}

/// `drivetrain search …`
#[derive(Debug, Subcommand)]
pub(crate) enum SearchCommand {
    /// Print a search's rungs: per rung its budget, the trials that reach it and the
    /// budget they use, against running every trial to the full budget.
    #[command(
        after_help = "Example:\n  drivetrain search preview pipelines/driving-loop-search.yaml --stage train"
    )]
    Preview {
        file: PathBuf,
        #[arg(long)]
        stage: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
}

/// `drivetrain plugins …`.
#[derive(Debug, Subcommand)]
pub(crate) enum PluginsCommand {
    /// Fetch the git plugins a pipeline uses into the home (validation reads no network).
    Fetch {
        /// The pipeline file.
        file: PathBuf,
    },
    /// Resolve every plugin a pipeline uses and write `drivetrain.lock` beside it.
    Lock {
        /// The pipeline file.
        file: PathBuf,
    },
}

/// Commands that read pipeline files: validate, draw, plan, and the steps and schemas they use.
#[derive(Debug, Subcommand)]
pub(crate) enum PipelineGroup {
    /// Check pipeline files and report every problem with its location.
    #[command(
        after_help = "Examples:\n  drivetrain validate pipelines/*.yaml\n  drivetrain validate broken.yaml --output json"
    )]
    Validate {
        /// Pipeline files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Print the pipeline's DAG as a Mermaid flowchart or Graphviz DOT.
    #[command(
        after_help = "Examples:\n  drivetrain graph pipelines/driving-loop.yaml\n  drivetrain graph pipelines/driving-loop.yaml --format dot | dot -Tsvg > loop.svg"
    )]
    Graph {
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// Print the resolved stages in execution order, with their resolved commands.
    #[command(
        after_help = "Examples:\n  drivetrain plan pipelines/driving-loop.yaml --param drives=4\n  drivetrain plan pipelines/driving-loop.yaml --from train --output json"
    )]
    Plan {
        file: PathBuf,
        /// Set a param: `--param name=value` (repeatable).
        #[arg(long = "param", short = 'p', value_name = "NAME=VALUE", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Only these stages (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// These stages and everything after them.
        #[arg(long, value_delimiter = ',')]
        from: Vec<String>,
        /// These stages and everything before them.
        #[arg(long, value_delimiter = ',')]
        to: Vec<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Override `defaults.executor` (`--manifests` needs `kubernetes`).
        #[arg(long)]
        executor: Option<String>,
        /// Print every Kubernetes object the run would create, as YAML documents
        /// (settings from the file `DRIVETRAIN_KUBERNETES` names).
        #[arg(long)]
        manifests: bool,
        /// The run id the manifests name (a run's own is known only when it starts).
        #[arg(long, default_value = "dry-run", requires = "manifests")]
        run_id: String,
    },
    /// Print the JSON Schema of pipeline files (for editors), or with `--api` the OpenAPI
    /// document of `drivetrain serve`'s HTTP API.
    #[command(
        after_help = "Examples:\n  drivetrain schema > pipeline.schema.json\n  drivetrain schema --api > docs/openapi.json\n  drivetrain schema --step > docs/step.schema.json"
    )]
    Schema {
        /// The OpenAPI document of the HTTP API instead.
        #[arg(long, conflicts_with = "step")]
        api: bool,
        /// The JSON Schema of plugin step files (`plugins/NAME/step.yaml`) instead.
        #[arg(long)]
        step: bool,
    },
    /// The plugin steps a pipeline uses: `fetch` brings git plugins into the home;
    /// `lock` pins every plugin (a tag or branch to its commit, each step's digest) in
    /// `drivetrain.lock` beside the pipeline.
    #[command(
        subcommand,
        after_help = "Examples:\n  drivetrain plugins fetch pipeline.yaml\n  drivetrain plugins lock pipeline.yaml"
    )]
    Plugins(PluginsCommand),
    /// List the built-in steps and executors; with a step's name, what its `with:` takes.
    #[command(
        after_help = "Examples:\n  drivetrain steps\n  drivetrain steps train\n  drivetrain steps --output json"
    )]
    Steps {
        /// One step: its inputs, outputs and every field of its `with:`.
        name: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
}

/// Commands that run stages: a run, a rerun or retry, a resume, and inside a stage `step` and `exec`.
#[derive(Debug, Subcommand)]
pub(crate) enum RunGroup {
    /// Run a pipeline on this machine: prints the run id, then each stage as it ends.
    #[command(
        after_help = "Examples:\n  drivetrain run pipelines/shell-demo.yaml\n  drivetrain run pipeline.yaml --param day=2026-11-20 --parallelism 4 --fail-fast\n\nExit codes: 0 succeeded, 1 failed, 2 usage, 130 cancelled."
    )]
    Run {
        file: PathBuf,
        /// Set a param: `--param name=value` (repeatable).
        #[arg(long = "param", short = 'p', value_name = "NAME=VALUE", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// The most stage attempts at once. Default: the number of cores.
        #[arg(long)]
        parallelism: Option<usize>,
        /// Stop everything at the first failed stage.
        #[arg(long)]
        fail_fast: bool,
        /// The run's deadline (`30m`, `2h`): past it, running stages are stopped and the
        /// run fails.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
        timeout: Option<std::time::Duration>,
        /// Override `defaults.executor`.
        #[arg(long)]
        executor: Option<String>,
        /// How many GPUs of this machine stages may claim (each given to one stage at a
        /// time as CUDA_VISIBLE_DEVICES). Default: DRIVETRAIN_LOCAL_GPUS, else those NVML
        /// or nvidia-smi find, within an outer CUDA_VISIBLE_DEVICES (`drivetrain doctor`).
        #[arg(long)]
        gpus: Option<usize>,
        /// Start the run in the background, print its id and return.
        #[arg(long)]
        detach: bool,
        /// Submit the run to a `drivetrain serve` (the file's YAML and the params) and
        /// follow it there (token: DRIVETRAIN_TOKEN).
        #[arg(long, value_name = "URL", conflicts_with_all = ["executor", "gpus", "parallelism", "run_id"])]
        server: Option<String>,
        /// The id to use (set by `--detach` for the background engine).
        #[arg(long, hide = true)]
        run_id: Option<String>,
        /// Neither look up nor record cache entries: every stage executes.
        #[arg(long)]
        no_cache: bool,
        /// Execute every stage and record its outputs as the cache entry.
        #[arg(long, conflicts_with = "no_cache")]
        overwrite_cache: bool,
        /// Use plugin steps only as `drivetrain.lock` pins them (for CI): refuse a plugin
        /// without an entry, of another digest, or whose tag or branch moved.
        #[arg(long)]
        locked: bool,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// A new run that executes some stages of an earlier run and reuses everything else
    /// of it exactly (even if the pipeline changed since).
    #[command(
        after_help = "Examples:\n  drivetrain rerun 20261122-031500-1a2b --stage train\n  drivetrain rerun 20261122-031500-1a2b --stage train --downstream --param epochs=20\n  drivetrain rerun 20261122-031500-1a2b --from mine --image train=ghcr.io/acme/train:v2\n  drivetrain rerun 20261122-031500-1a2b --only label-export,train\n\nThe stages it executes ignore the cache. Exit codes as `run`."
    )]
    Rerun {
        run: String,
        /// Stages to execute (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        stage: Vec<String>,
        /// Also execute everything that depends on the `--stage` stages.
        #[arg(long, requires = "stage")]
        downstream: bool,
        /// These stages and everything after them.
        #[arg(long, value_delimiter = ',')]
        from: Vec<String>,
        /// Exactly these stages.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Override a param of the earlier run: `--param name=value` (repeatable).
        #[arg(long = "param", short = 'p', value_name = "NAME=VALUE", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Override a stage's image: `--image STAGE=IMAGE` (repeatable).
        #[arg(long = "image", value_name = "STAGE=IMAGE", value_parser = parse_kv)]
        images: Vec<(String, String)>,
        #[command(flatten)]
        common: FromRun,
    },
    /// A new run that reuses every succeeded stage of an earlier run and executes the
    /// failed, cancelled and skipped ones and what depends on them.
    #[command(after_help = "Example:\n  drivetrain retry 20261122-031500-1a2b")]
    Retry {
        run: String,
        #[command(flatten)]
        common: FromRun,
    },
    /// Finish a run whose engine stopped: succeeded stages are kept, lost attempts rerun.
    #[command(after_help = "Example:\n  drivetrain resume 20261122-031500-1a2b")]
    Resume {
        run: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Run one built-in step with the attempt's environment (what `drivetrain run` starts
    /// for `uses:` stages, and a container's command on a cluster).
    #[command(
        after_help = "Reads DRIVETRAIN_STEP_CONFIG (the rendered `with:` block as JSON), DRIVETRAIN_INPUT_<NAME>, DRIVETRAIN_OUTPUT_<NAME>, DRIVETRAIN_VALUES and, when distributed, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.\n\nExample:\n  DRIVETRAIN_STEP_CONFIG='{\"drives\": 2}' DRIVETRAIN_OUTPUT_LOGS=out DRIVETRAIN_VALUES=values.json drivetrain step fleet-sim"
    )]
    Step { name: String },
    /// The wrapper around a stage's command in a pod: fetch inputs, run, upload outputs
    /// (what the kubernetes executor starts; not for people).
    #[command(hide = true)]
    Exec {
        /// Copy this binary into DIR and exit (the pod's init container).
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        install: Option<PathBuf>,
        /// Run one task of a Slurm job array: the map item the slurm executor wrote into
        /// FILE (read and removed).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["command", "install"])]
        task: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(last = true)]
        command: Vec<String>,
    },
}

/// Commands that read what runs made: why a stage hit the cache, lineage, forgetting, garbage collection, the registry.
#[derive(Debug, Subcommand)]
pub(crate) enum HistoryGroup {
    /// Why a stage of a run was a cache hit or a miss: the component of its key that
    /// changed.
    #[command(after_help = "Example:\n  drivetrain explain 20261122-031500-1a2b train")]
    Explain {
        run: String,
        stage: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Where an artifact came from (runs, stages, params, definitions, back to the
    /// sources), or with `--downstream` everything derived from it.
    #[command(
        after_help = "TARGET is a run, RUN/STAGE, RUN/STAGE/OUTPUT or an artifact digest.\n\nExamples:\n  drivetrain lineage 20261122-031500-1a2b/train/model\n  drivetrain lineage 20261122-031500-1a2b/ingest/frames --downstream --output mermaid"
    )]
    Lineage {
        target: String,
        #[arg(long)]
        downstream: bool,
        #[arg(long, short = 'o', value_enum, default_value_t = GraphOutput::Text)]
        output: GraphOutput,
    },
    /// Everything derived from a source: an artifact, or any text a stage's definition
    /// mentions (a drive log's URL), for data-deletion requests.
    #[command(
        after_help = "Examples:\n  drivetrain forget s3://fleet/drives/2026-11-20/veh42.mcap\n  drivetrain forget 20261122-031500-1a2b/ingest/frames --output json"
    )]
    Forget {
        input: String,
        #[arg(long, short = 'o', value_enum, default_value_t = GraphOutput::Text)]
        output: GraphOutput,
    },
    /// List (and with --apply delete) artifacts no kept run, cache entry or running run
    /// refers to.
    #[command(
        after_help = "Examples:\n  drivetrain gc                    # dry run, runs older than 30 days\n  drivetrain gc --keep-days 7 --apply"
    )]
    Gc {
        /// Runs younger than this many days keep everything.
        #[arg(long, default_value_t = 30)]
        keep_days: u32,
        /// Delete; without it gc only lists.
        #[arg(long)]
        apply: bool,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// The model registry in the artifact store: models, versions, aliases, history.
    #[command(
        after_help = "Examples:\n  drivetrain registry list\n  drivetrain registry show risk-model@production\n  drivetrain registry history risk-model\n  drivetrain registry alias risk-model production 3\n  drivetrain registry rollback risk-model production"
    )]
    Registry {
        /// The registry: an artifact store URL or `mlflow+http://HOST:PORT`; default
        /// `DRIVETRAIN_REGISTRY`, else the registry in the artifact store.
        #[arg(long, global = true)]
        registry: Option<String>,
        /// Whose registry: a project's is in its artifact store (default `default`).
        #[arg(long, global = true, default_value = "default")]
        project: String,
        #[command(subcommand)]
        command: RegistryCommand,
    },
}

/// Commands that look at runs: status, logs, the list, and cancel.
#[derive(Debug, Subcommand)]
pub(crate) enum InspectGroup {
    /// Show a run's stages: phase, attempts, duration, exit code, reason.
    #[command(
        after_help = "Examples:\n  drivetrain status            # the latest run\n  drivetrain status 20261122-031500-1a2b --output json"
    )]
    Status {
        run: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Show the status again every second until the run ends; exit 0 when it
        /// succeeded, 1 otherwise.
        #[arg(long, short = 'w', conflicts_with = "server")]
        watch: bool,
        /// Ask a `drivetrain serve` instead of this machine (token: DRIVETRAIN_TOKEN).
        #[arg(long, value_name = "URL")]
        server: Option<String>,
    },
    /// Print the logs of a run's stages (the latest attempt of each).
    #[command(
        after_help = "Examples:\n  drivetrain logs 20261122-031500-1a2b\n  drivetrain logs 20261122-031500-1a2b --stage train"
    )]
    Logs {
        run: Option<String>,
        #[arg(long)]
        stage: Option<String>,
        /// Keep printing as the stages write, until the stage (with `--stage`) or the
        /// whole run ends; a whole run's lines start with their stage's name.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Ask a `drivetrain serve` instead of this machine (needs a run and `--stage`).
        #[arg(long, value_name = "URL", requires_all = ["run", "stage"])]
        server: Option<String>,
    },
    /// Cancel a run: its running stages are stopped and it is recorded as cancelled.
    #[command(after_help = "Example:\n  drivetrain cancel 20261122-031500-1a2b")]
    Cancel {
        run: String,
        /// Ask a `drivetrain serve` to cancel it.
        #[arg(long, value_name = "URL")]
        server: Option<String>,
    },
    /// List recent runs, newest first.
    #[command(
        after_help = "Examples:\n  drivetrain list\n  drivetrain list --pipeline driving-loop --phase failed --limit 10\n  drivetrain list -o json"
    )]
    List {
        /// How many runs (after filtering).
        #[arg(long, short = 'n', default_value_t = 50)]
        limit: usize,
        /// Only runs of this pipeline.
        #[arg(long)]
        pipeline: Option<String>,
        /// Only runs in this phase (`running`, `succeeded`, `failed`, …; any case).
        #[arg(long)]
        phase: Option<String>,
        /// Only runs started so (`cli`, `api`, `schedule`, `rerun`, `retry`).
        #[arg(long)]
        trigger: Option<String>,
        /// Only runs created at or after this RFC 3339 time (`2026-11-24T00:00:00Z`).
        #[arg(long)]
        since: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
}

/// People's commands: approvals, tokens, the audit log, projects and who may do what.
#[derive(Debug, Subcommand)]
pub(crate) enum PeopleGroup {
    /// Approve a stage waiting for people (`approval:`). Once enough people with its role
    /// have, the run goes on: here, in the foreground, unless `--server` or a `serve` on
    /// this home takes it.
    #[command(
        after_help = "Examples:\n  drivetrain approve 20261126-101500-ab12cd34 release-gate --comment 'slices hold'\n  DRIVETRAIN_TOKEN=... drivetrain approve RUN release-gate --server http://127.0.0.1:8080"
    )]
    Approve {
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Reject a stage waiting for people: the stage fails, the run ends.
    Reject {
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Approvals: what each waits for, its evidence, votes and outcome.
    Approvals {
        /// Only those still waiting.
        #[arg(long)]
        waiting: bool,
        #[arg(short = 'n', long = "limit", default_value_t = 50)]
        limit: usize,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// API tokens of `drivetrain serve`: a role in a project each, stored hashed.
    #[command(
        after_help = "Examples:\n  drivetrain token create --project default --role launcher --name ci\n  drivetrain token create --project default --role viewer --approves safety --name alice\n  drivetrain token list\n  drivetrain token revoke ci"
    )]
    Token {
        #[command(subcommand)]
        command: TokenCommand,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text, global = true)]
        output: Format,
    },
    /// The audit log: every mutating action, allowed or denied, with who and what changed.
    #[command(
        after_help = "Examples:\n  drivetrain audit --since 2026-11-01\n  drivetrain audit -o json -n 1000"
    )]
    Audit {
        /// A date (`2026-11-01`) or an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(short = 'n', long = "limit", default_value_t = 100)]
        limit: usize,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Projects: their quotas (runs in flight and GPUs claimed, kept by `serve`).
    #[command(
        after_help = "Examples:\n  drivetrain project quota perception --max-runs 4 --max-gpus 16\n  drivetrain project list"
    )]
    Project {
        #[command(subcommand)]
        command: ProjectCommand,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text, global = true)]
        output: Format,
    },
    /// Explain an authorization decision.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
}

/// The server and what it keeps: `serve`, `ui`, schedules, triggers, notifications, and `doctor`.
#[derive(Debug, Subcommand)]
pub(crate) enum ServerGroup {
    /// Run the pipelines of a directory on their cron schedules (until Ctrl-C / SIGTERM,
    /// which lets the runs in flight finish).
    #[command(
        after_help = "Examples:\n  drivetrain serve --pipelines pipelines/ --bind 127.0.0.1:8080\n  DRIVETRAIN_TOKEN=s3cret drivetrain serve --pipelines pipelines/ --bind 0.0.0.0:8080\n  curl -H 'Authorization: Bearer s3cret' localhost:8080/api/v1/runs\n  drivetrain schedule list\n\nA tick is recorded before its run starts: a server killed and started again neither fires a tick twice nor loses one (within the schedule's `catchup`)."
    )]
    Serve {
        /// The directory of pipeline files; those with a `schedule:` run on it, all can be
        /// submitted over the API.
        #[arg(long, value_name = "DIR")]
        pipelines: PathBuf,
        /// Where the HTTP API listens (`127.0.0.1:0` picks a free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: String,
        /// The bearer token the API requires; required to bind anything but a loopback
        /// address. Every process on the machine can read a command line: prefer
        /// `--token-file` or `DRIVETRAIN_TOKEN`.
        #[arg(long, conflicts_with = "token_file")]
        token: Option<String>,
        /// A file whose first line is the bearer token (a mounted secret).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Without a token, let every client on this machine start, rerun and cancel runs
        /// (by default a server without a token answers reads only).
        #[arg(long)]
        insecure_no_auth: bool,
        /// The most stage attempts at once, per run.
        #[arg(long)]
        parallelism: Option<usize>,
        /// Notification sinks for every run this server sees, besides each pipeline's
        /// own: a YAML file with `notify:`, shaped as a pipeline's.
        #[arg(long, value_name = "FILE")]
        notify: Option<PathBuf>,
        /// OpenID Connect: accept ID tokens of this issuer, groups mapped to roles (a
        /// YAML file: issuer, audience, roles).
        #[arg(long, value_name = "FILE")]
        oidc: Option<PathBuf>,
        /// Where people reach this server's web view (behind a proxy or load balancer):
        /// the base of the run links in Slack and e-mail notifications. By default the
        /// address it listens on (or `DRIVETRAIN_PUBLIC_URL`).
        #[arg(long, value_name = "URL")]
        public_url: Option<String>,
    },
    /// The web view of this home's runs, stages, logs, lineage and registry: `serve` for
    /// one person (it also serves the view at `/`), without firing schedules or taking
    /// over orphaned runs; it executes only what its buttons ask for.
    #[command(
        after_help = "Examples:\n  drivetrain ui                              # http://127.0.0.1:8080, read-only\n  drivetrain ui --insecure-no-auth           # and the buttons (cancel, retry, rerun) work\n  drivetrain ui --pipelines pipelines/ --token \"$TOKEN\""
    )]
    Ui {
        /// Pipelines that can be started by name (their schedules do not fire).
        #[arg(long, value_name = "DIR")]
        pipelines: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: String,
        /// The bearer token the page asks for (prefer `--token-file` or
        /// `DRIVETRAIN_TOKEN`: a command line is visible to every process).
        #[arg(long, conflicts_with = "token_file")]
        token: Option<String>,
        /// A file whose first line is the bearer token.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Without a token, let the page (and every client on this machine) start, rerun
        /// and cancel runs.
        #[arg(long)]
        insecure_no_auth: bool,
    },
    /// The schedules `serve` keeps: list, suspend, resume, trigger now.
    #[command(
        after_help = "Examples:\n  drivetrain schedule list\n  drivetrain schedule next nightly-retrain -n 5\n  drivetrain schedule suspend nightly-retrain\n  drivetrain schedule resume nightly-retrain            # missed ticks do not fire\n  drivetrain schedule resume nightly-retrain --catchup  # they follow `catchup`\n  drivetrain schedule trigger nightly-retrain"
    )]
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text, global = true)]
        output: Format,
    },
    /// The triggers `serve` keeps: their cursor, inbox and last decision; pause, resume,
    /// backfill.
    #[command(
        after_help = "Examples:\n  drivetrain trigger list\n  drivetrain trigger show fleet-ingest/new-logs\n  drivetrain trigger pause new-logs           # objects keep queueing, no run starts\n  drivetrain trigger resume new-logs --replay # what queued starts runs\n  drivetrain trigger resume new-logs --skip   # what queued is skipped\n  drivetrain trigger backfill new-logs --since 2026-11-01"
    )]
    Trigger {
        #[command(subcommand)]
        command: TriggerCommand,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text, global = true)]
        output: Format,
    },
    /// The notifications outbox: what was sent, what waits, what is dead.
    #[command(
        after_help = "Examples:\n  drivetrain notifications --status dead\n  drivetrain notifications -o json -n 500"
    )]
    Notifications {
        /// Only those `pending`, `delivered` or `dead` (not `--state`: that is the state
        /// store's URL, for every command).
        #[arg(long, value_parser = ["pending", "delivered", "dead"])]
        status: Option<String>,
        #[arg(short = 'n', long = "limit", default_value_t = 50)]
        limit: usize,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// The home's GPUs as its ledger sees them, by queue: which attempts hold devices
    /// (priority, preemptible, being preempted), which wait and why (their place, what
    /// they wait for), and claims of runs that ended.
    #[command(
        after_help = "Examples:\n  drivetrain queue\n  drivetrain queue -o json\n  drivetrain queue class high 100\n  drivetrain queue class high --delete"
    )]
    Queue {
        #[command(subcommand)]
        command: Option<QueueCommand>,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// What this machine offers local runs: cores, GPUs and how they were found (NVML,
    /// nvidia-smi, CUDA_VISIBLE_DEVICES), stage isolation; with `--slurm`, whether the
    /// Slurm cluster answers and its jobs see this home.
    #[command(
        after_help = "Examples:\n  drivetrain doctor\n  drivetrain doctor -o json\n  CUDA_VISIBLE_DEVICES=2,3 drivetrain doctor\n  SLURM_CONF=/etc/slurm/slurm.conf drivetrain doctor --slurm"
    )]
    Doctor {
        /// Take this many GPUs as given, as `run --gpus` does.
        #[arg(long)]
        gpus: Option<usize>,
        /// Check the slurm executor too: `sinfo` answers, and a probe job writes into this
        /// home's work directory (the file system the jobs must share with the engine).
        #[arg(long)]
        slurm: bool,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Names a priority for `scheduling: {priority: NAME}` in this home (on Kubernetes the
    /// name is the cluster's class; here it is this value).
    Class {
        /// A DNS label: `high`, `batch`.
        name: String,
        /// From -1000000 to 1000000; higher goes first.
        #[arg(allow_negative_numbers = true, required_unless_present = "delete")]
        value: Option<i64>,
        /// Forget the name.
        #[arg(long, conflicts_with = "value")]
        delete: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Every schedule, whether it is suspended, its next tick and its last.
    List,
    /// The upcoming ticks of a schedule, in its zone and in UTC.
    Next {
        /// A registered schedule's pipeline name, or a pipeline file.
        pipeline: String,
        /// How many.
        #[arg(short = 'n', long = "count", default_value_t = 10)]
        count: usize,
    },
    /// Fire nothing until resumed.
    Suspend { pipeline: String },
    /// Fire again; ticks missed while suspended do not fire unless `--catchup`.
    Resume {
        pipeline: String,
        #[arg(long)]
        catchup: bool,
    },
    /// Start a run now (the server picks it up).
    Trigger { pipeline: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TriggerCommand {
    /// Every trigger: state, inbox depth, lag of the oldest waiting object, last decision.
    List,
    /// One trigger (`PIPELINE/TRIGGER`, or `TRIGGER` when only one pipeline has it).
    Show { trigger: String },
    /// Start no run until resumed; objects keep being discovered and queue.
    Pause { trigger: String },
    /// Start runs again: `--replay` what queued while paused, or `--skip` it.
    Resume {
        trigger: String,
        #[arg(long, conflicts_with = "skip")]
        replay: bool,
        #[arg(long)]
        skip: bool,
    },
    /// List the trigger's prefix and queue the objects modified since a date that it has
    /// not seen (those it has are not taken twice).
    Backfill {
        trigger: String,
        /// A date (`2026-11-01`) or an RFC 3339 time.
        #[arg(long)]
        since: String,
    },
}

/// What `approve` and `reject` share.
#[derive(Debug, clap::Args)]
pub(crate) struct DecisionArgs {
    pub(crate) run: String,
    pub(crate) stage: String,
    /// Why, kept with the decision.
    #[arg(long)]
    pub(crate) comment: Option<String>,
    /// Decide through a `drivetrain serve` (token: DRIVETRAIN_TOKEN).
    #[arg(long)]
    pub(crate) server: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a token and print it, once: only its hash is kept.
    Create {
        /// The project it acts in (`*`: every project).
        #[arg(long, default_value = "default")]
        project: String,
        /// `viewer`, `launcher`, `editor` or `admin`.
        #[arg(long)]
        role: String,
        /// An approval role it holds (`safety`); repeatable.
        #[arg(long, value_name = "ROLE")]
        approves: Vec<String>,
        /// Who holds it (what the audit log and votes call it); default: `token-ID`.
        #[arg(long)]
        name: Option<String>,
    },
    /// Every token (never a secret).
    List,
    /// Revoke a token by id or name.
    Revoke { token: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ProjectCommand {
    /// Every project with runs or a quota: its quota and its runs by phase.
    List,
    /// Set a project's quota; a bound left out is none.
    Quota {
        project: String,
        /// Runs in flight at once (the rest wait, Pending, first come first served).
        #[arg(long)]
        max_runs: Option<u32>,
        /// GPUs its runs in flight claim at once.
        #[arg(long)]
        max_gpus: Option<u32>,
        /// Its share of the home's GPUs when projects contend at one priority (default 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        weight: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuthCommand {
    /// Whether SUBJECT may do VERB to RESOURCE, and why. SUBJECT: a token's name or id
    /// (`alice`, `tok_…`); VERB: read, launch, cancel, author, configure, move-alias,
    /// approve, manage-tokens, read-audit; RESOURCE: `project/P`, `run/RUN`,
    /// `approval/RUN/STAGE`, `alias/MODEL/ALIAS`.
    #[command(
        after_help = "Examples:\n  drivetrain auth can alice approve approval/20261126-101500-ab12cd34/release-gate\n  drivetrain auth can ci cancel run/20261126-101500-ab12cd34"
    )]
    Can {
        subject: String,
        verb: String,
        resource: String,
    },
}

/// What `rerun` and `retry` share.
#[derive(Debug, clap::Args)]
pub(crate) struct FromRun {
    /// The pipeline file; default: the one the earlier run was started from.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    #[arg(long)]
    pub(crate) parallelism: Option<usize>,
    #[arg(long)]
    pub(crate) fail_fast: bool,
    /// Record no cache entries (and, for `retry`, look none up).
    #[arg(long)]
    pub(crate) no_cache: bool,
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
    pub(crate) output: Format,
    /// The new run's id (set by the server, which answers with it before the run starts).
    #[arg(long, hide = true)]
    pub(crate) run_id: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RegistryCommand {
    /// Models with their versions and aliases.
    List {
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// One version (`MODEL@VERSION` or `MODEL@ALIAS`): where it came from, its metrics and
    /// files (`-o json`: the whole record, lineage included).
    Show {
        spec: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Every alias move of a model: who, when, from, to, the gate result.
    History {
        model: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Point an alias at a version.
    Alias {
        model: String,
        alias: String,
        version: u64,
        /// Why, recorded with the move.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Move an alias back to the version it pointed at before.
    Rollback { model: String, alias: String },
    /// Let only people with an approval role move ALIAS (of every model) by hand, and runs
    /// only through an approval by that role upstream of the stage that moves it.
    #[command(
        after_help = "Examples:\n  drivetrain registry protect production --role safety\n  drivetrain registry protect production --off"
    )]
    Protect {
        alias: String,
        #[arg(long, required_unless_present = "off")]
        role: Option<String>,
        /// Protect it no more.
        #[arg(long, conflicts_with = "role")]
        off: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GraphFormat {
    Mermaid,
    Dot,
}

/// The answer to `drivetrain --version` (or `-V`) alone, given before clap builds the
/// parser: building its 27 commands and their flags is most of what such a process costs
/// (half of its page faults: bench/README.md, "The binaries"). The same text as clap's
/// (a test below compares them); `None` for every other command line.
pub(crate) fn version_only(mut args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let _program = args.next();
    match (args.next(), args.next()) {
        (Some(flag), None) if flag == "--version" || flag == "-V" => {
            Some(format!("drivetrain {}\n", env!("CARGO_PKG_VERSION")))
        }
        _ => None,
    }
}

pub(crate) fn parse_duration_arg(
    s: &str,
) -> Result<std::time::Duration, drivetrain_engine::units::UnitError> {
    drivetrain_engine::units::parse_duration(s)
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

/// Output formats of `lineage` and `forget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GraphOutput {
    Text,
    Json,
    Dot,
    Mermaid,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn args(list: &[&str]) -> impl Iterator<Item = std::ffi::OsString> {
        list.iter()
            .map(|a| a.into())
            .collect::<Vec<std::ffi::OsString>>()
            .into_iter()
    }

    #[test]
    fn the_early_version_is_clap_s() {
        let clap = Cli::command().render_version().to_string();
        assert_eq!(
            version_only(args(&["drivetrain", "--version"])),
            Some(clap.clone())
        );
        assert_eq!(
            version_only(args(&["/usr/bin/drivetrain", "-V"])),
            Some(clap)
        );
        for other in [
            &["drivetrain"][..],
            &["drivetrain", "--help"],
            &["drivetrain", "--version", "list"],
            &["drivetrain", "list", "--version"],
            &["drivetrain", "--versions"],
        ] {
            assert_eq!(version_only(args(other)), None, "{other:?}");
        }
    }
}
