//! `drivetrain approve|reject|approvals|token|audit|auth can`: people's side of the
//! engine, on this home's state store (or a server's API with `--server`).
//!
//! A command run here acts as the local user (`user:NAME@HOST`, see
//! [`drivetrain_engine::step::who`]): whoever can write this home's state store can do
//! anything to it, so the local user holds every role and every approval role, and one
//! person is one vote. Token changes and decisions made here go to the audit log as theirs.

use crate::output::Format;
use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::access::{self, Role, Verb};
use drivetrain_engine::state::{Refusal, RunId, TokenRecord, Vote};
use serde_json::json;

use crate::cli::{DecisionArgs, TokenCommand};
use crate::runs::open_state;
use drivetrain_server::access::{token_hash, token_subject};

use crate::audit::{audit_local, local_user};

/// `approve` / `reject`: counts the decision; once decided, resumes the run here unless
/// another engine (a `serve`) took it first.
pub fn decide(
    catalog: &drivetrain_engine::Catalog,
    home: &Path,
    d: &DecisionArgs,
    decision: &str,
) -> anyhow::Result<ExitCode> {
    if let Some(server) = &d.server {
        let remote = crate::client::Remote::new(server);
        let body = match &d.comment {
            Some(c) => json!({"comment": c}),
            None => json!({}),
        };
        let a = remote.post(
            &format!("/api/v1/runs/{}/stages/{}/{decision}", d.run, d.stage),
            &body,
        )?;
        println!(
            "{}/{}: {}",
            d.run,
            d.stage,
            a["outcome"].as_str().unwrap_or("counted; still waiting")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let state = open_state(home)?;
    let run = RunId(d.run.clone());
    let vote = Vote {
        subject: local_user().name,
        decision: decision.into(),
        comment: d.comment.clone(),
        at: drivetrain_engine::state::now(),
    };
    let record = match state.vote(&run, &d.stage, &vote)? {
        Ok(a) => a,
        Err(Refusal::Unknown) => {
            eprintln!(
                "error: run {} has no stage `{}` waiting for approval",
                d.run, d.stage
            );
            return Ok(crate::exit::usage());
        }
        Err(why) => {
            eprintln!("error: {}/{}: {why}", d.run, d.stage);
            return Ok(crate::exit::failed());
        }
    };
    audit_local(
        state.as_ref(),
        &record.request.project,
        &format!("approvals.{decision}"),
        format!("/api/v1/runs/{}/stages/{}/{decision}", d.run, d.stage),
        json!({"vote": decision, "outcome": record.outcome}),
    )?;
    let Some(outcome) = &record.outcome else {
        let yes = record.votes.len();
        println!(
            "{}/{}: counted ({yes} of {} approvals); still waiting",
            d.run, d.stage, record.request.min
        );
        return Ok(ExitCode::SUCCESS);
    };
    println!(
        "{}/{}: {outcome} ({})",
        d.run,
        d.stage,
        record.reason.as_deref().unwrap_or("")
    );
    if !state.take_decided(&run)? {
        println!("run {run} goes on where it is: its engine, another approval, or a server");
        return Ok(ExitCode::SUCCESS);
    }
    drop(state);
    crate::runs::resume(catalog, home, &d.run, Format::Text)
}

/// `approvals`.
pub fn approvals(
    home: &Path,
    waiting: bool,
    limit: usize,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let all = state.approvals(waiting, limit)?;
    if out.json() {
        crate::output::print_json(&all)?;
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        println!("no approvals{}", if waiting { " waiting" } else { "" });
    }
    for a in &all {
        let r = &a.request;
        let yes = a.approvers().len();
        println!(
            "{}/{}  {}  {yes} of {} by role `{}`{}",
            r.run,
            r.stage,
            a.outcome.as_deref().unwrap_or("waiting"),
            r.min,
            r.role,
            r.timeout_at
                .as_ref()
                .filter(|_| a.outcome.is_none())
                .map(|t| format!(", times out {t} ({})", r.on_timeout))
                .unwrap_or_default()
        );
        for v in &a.votes {
            println!(
                "    {} {} at {}{}",
                v.subject,
                v.decision,
                v.at,
                v.comment
                    .as_ref()
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default()
            );
        }
        if let Some(stages) = r.evidence["stages"].as_object() {
            for (stage, e) in stages {
                println!(
                    "    evidence {stage}: values {} (lineage: drivetrain lineage {})",
                    e["values"],
                    e["lineage"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A new token's secret: 32 random bytes from the kernel, hex.
fn secret() -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("dt_{}", hex::encode(bytes)))
}

/// `token create|list|revoke`.
pub fn token(home: &Path, command: TokenCommand, out: Format) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    match command {
        TokenCommand::Create {
            project,
            role,
            approves,
            name,
        } => {
            if Role::parse(&role).is_none() {
                eprintln!("error: --role `{role}`: give viewer, launcher, editor or admin");
                return Ok(crate::exit::usage());
            }
            let secret = secret()?;
            let id = format!("tok_{}", &token_hash(&secret)[..12]);
            let t = TokenRecord {
                name: name.unwrap_or_else(|| format!("token-{}", &id[4..])),
                id,
                project,
                role,
                approves,
                created_at: drivetrain_engine::state::now(),
                created_by: local_user().name,
                revoked_at: None,
            };
            if state
                .tokens()?
                .iter()
                .any(|o| o.name == t.name && o.revoked_at.is_none())
            {
                eprintln!(
                    "error: a token named `{}` exists: revoke it first, or give another --name",
                    t.name
                );
                return Ok(crate::exit::usage());
            }
            state.add_token(&t, &token_hash(&secret))?;
            audit_local(
                state.as_ref(),
                &t.project,
                "tokens.create",
                format!("token/{}", t.id),
                json!({"name": t.name, "role": t.role, "approves": t.approves}),
            )?;
            if out.json() {
                println!("{}", json!({"token": secret, "record": t}));
            } else {
                println!("{secret}");
                eprintln!(
                    "token {} ({}) created: {} in project `{}`{}; it is shown this once",
                    t.id,
                    t.name,
                    t.role,
                    t.project,
                    match t.approves.is_empty() {
                        true => String::new(),
                        false => format!(", approves {}", t.approves.join(", ")),
                    }
                );
            }
        }
        TokenCommand::List => {
            let all = state.tokens()?;
            if out.json() {
                crate::output::print_json(&all)?;
                return Ok(ExitCode::SUCCESS);
            }
            for t in &all {
                println!(
                    "{:<16} {:<16} {:<12} {:<9} {:<16} {}",
                    t.id,
                    t.name,
                    t.project,
                    t.role,
                    t.approves.join(","),
                    match &t.revoked_at {
                        Some(at) => format!("revoked {at}"),
                        None => format!("created {} by {}", t.created_at, t.created_by),
                    }
                );
            }
        }
        TokenCommand::Revoke { token } => match state.revoke_token(&token)? {
            Some(t) => {
                audit_local(
                    state.as_ref(),
                    &t.project,
                    "tokens.revoke",
                    format!("token/{}", t.id),
                    json!({"name": t.name, "revoked": true}),
                )?;
                println!("token {} ({}) revoked", t.id, t.name);
            }
            None => {
                eprintln!("error: no unrevoked token `{token}`");
                return Ok(crate::exit::usage());
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit`.
pub fn audit(
    home: &Path,
    since: Option<&str>,
    limit: usize,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let since = match since.map(crate::triggers::parse_since).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(crate::exit::usage());
        }
    };
    let state = open_state(home)?;
    let entries = state.audit(&since, 0, limit)?;
    if out.json() {
        crate::output::print_json(&entries)?;
        return Ok(ExitCode::SUCCESS);
    }
    for e in &entries {
        println!(
            "{:>5} {} {:<7} {:<28} {:<26} {} [{}] {}",
            e.seq,
            e.at,
            e.decision,
            e.subject,
            e.action,
            e.resource,
            e.project,
            e.reason.as_deref().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `auth can SUBJECT VERB RESOURCE`.
pub fn can(home: &Path, subject: &str, verb: &str, resource: &str) -> anyhow::Result<ExitCode> {
    let Some(verb) = Verb::parse(verb) else {
        let all: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
        eprintln!(
            "error: unknown verb `{verb}`: give one of {}",
            all.join(", ")
        );
        return Ok(crate::exit::usage());
    };
    let state = open_state(home)?;
    let found = state
        .tokens()?
        .into_iter()
        .find(|t| t.revoked_at.is_none() && (t.name == subject || t.id == subject));
    let Some(token) = found else {
        eprintln!("error: no unrevoked token named `{subject}` (`drivetrain token list`)");
        return Ok(crate::exit::usage());
    };
    let who = token_subject(&token);
    let project = drivetrain_server::access::DEFAULT_PROJECT;
    let parts: Vec<&str> = resource.split('/').collect();
    let approval = match parts.as_slice() {
        ["approval", run, stage] => match state.approval(&RunId((*run).into()), stage)? {
            Some(a) => Some(a.request.role),
            None => {
                eprintln!("error: run {run} asks no approval at stage `{stage}`");
                return Ok(crate::exit::usage());
            }
        },
        ["alias", _model, alias] => state.protected_aliases()?.get(*alias).cloned(),
        ["project", _] | ["run", _] => None,
        _ => {
            eprintln!(
                "error: resource `{resource}`: give project/P, run/RUN, approval/RUN/STAGE or alias/MODEL/ALIAS"
            );
            return Ok(crate::exit::usage());
        }
    };
    let d = access::decide(&who, verb, project, approval.as_deref());
    println!(
        "{}: {}",
        if d.allowed { "allowed" } else { "denied" },
        d.reason
    );
    Ok(ExitCode::from(if d.allowed { 0 } else { 1 }))
}

/// `registry protect ALIAS --role R` / `--off`.
pub fn protect(home: &Path, alias: &str, role: Option<&str>) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let who = local_user().name;
    state.protect_alias(alias, role, &who)?;
    audit_local(
        state.as_ref(),
        drivetrain_server::access::DEFAULT_PROJECT,
        "registry.protect",
        format!("alias/{alias}"),
        json!({"alias": alias, "role": role}),
    )?;
    match role {
        Some(r) => println!("alias `{alias}` now moves only through an approval by role `{r}`"),
        None => println!("alias `{alias}` is protected no more"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `project list|quota`.
pub fn project(
    home: &Path,
    command: crate::cli::ProjectCommand,
    out: Format,
) -> anyhow::Result<ExitCode> {
    use crate::cli::ProjectCommand as C;
    use drivetrain_engine::state::Quota;
    let state = open_state(home)?;
    match command {
        C::Quota {
            project,
            max_runs,
            max_gpus,
            weight,
        } => {
            if let Err(why) = drivetrain_engine::validate::dns1123_label(&project) {
                eprintln!("error: project name `{project}` {why}");
                return Ok(crate::exit::usage());
            }
            let q = Quota {
                max_runs,
                max_gpus,
                weight,
            };
            state.set_quota(&project, q, &local_user().name)?;
            audit_local(
                state.as_ref(),
                &project,
                "projects.quota",
                format!("project/{project}"),
                serde_json::to_value(q)?,
            )?;
            let bound = |b: Option<u32>| b.map_or("any".to_owned(), |n| n.to_string());
            println!(
                "project `{project}`: {} runs, {} GPUs at once, weight {}",
                bound(max_runs),
                bound(max_gpus),
                weight.unwrap_or(1)
            );
        }
        C::List => {
            let quotas = state.quotas()?;
            let mut projects: std::collections::BTreeMap<String, serde_json::Value> = quotas
                .iter()
                .map(|(p, q)| (p.clone(), json!({"quota": q, "runs": {}})))
                .collect();
            for r in state.list_runs(100_000)? {
                let e = projects
                    .entry(r.project.clone())
                    .or_insert_with(|| json!({"quota": Quota::default(), "runs": {}}));
                let n = &mut e["runs"][r.phase.as_str()];
                *n = json!(n.as_u64().unwrap_or(0) + 1);
            }
            if out.json() {
                crate::output::print_json(&projects)?;
                return Ok(ExitCode::SUCCESS);
            }
            for (p, e) in &projects {
                println!(
                    "{p:<20} quota runs {:<5} gpus {:<5} runs {}",
                    e["quota"]["max_runs"]
                        .as_u64()
                        .map_or("any".into(), |n| n.to_string()),
                    e["quota"]["max_gpus"]
                        .as_u64()
                        .map_or("any".into(), |n| n.to_string()),
                    e["runs"]
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
