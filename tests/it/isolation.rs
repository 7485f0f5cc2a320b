//! A stage started by an engine running as root cannot undo the mounts that make the
//! store and the engine's home read-only for it (issue 16's probe).
//!
//! CI runs as root, which is the case this is about: a root stage kept `CAP_SYS_ADMIN`
//! and could `umount -l` the read-only bind of the home, then overwrite artifacts and rows
//! of `state.db` while its run reported Succeeded. The test runs with
//! `DRIVETRAIN_ISOLATION=required`, so it fails rather than passes vacuously where no
//! namespace can be had; as another user it says so and checks nothing (that case is the
//! user-namespace path, whose attempt drops its capabilities at `exec` anyway), except
//! under `CI=true`, where a test that cannot run as root fails: CI must check it.
//!
//! A layer the kernel refuses is shown too: with user namespaces refused (the engine runs
//! inside `unshare -U -r -m` with `user.max_user_namespaces = 0`, which only that
//! namespace sees), `required` fails the stage naming the layer, and `auto` runs it in a
//! mount namespace alone.

use crate::common;

use common::*;

/// Whether this test runs as root; when not, it is skipped with `why`, except under
/// `CI=true`, where it fails: the isolation tests must never pass without checking.
pub(crate) fn root_or_skip(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "CI runs the isolation tests as root, and this one is not: {why}"
    );
    eprintln!("not root, skipped: {why}");
    false
}

/// `drivetrain ARGS` in `home` with user namespaces refused to it and its stages.
fn without_user_namespaces(home: &Home, isolation: &str, args: &[&str]) -> std::process::Output {
    refusing(&["user"], home, isolation, args)
}

/// `drivetrain ARGS` in `home`, run as root of a user namespace of its own (`unshare -U
/// -r -m`) in which the kernel refuses each of `kinds` of namespace (`user`, `pid`,
/// `net`: `user.max_KIND_namespaces = 0`, which only that namespace and its children see).
fn refusing(kinds: &[&str], home: &Home, isolation: &str, args: &[&str]) -> std::process::Output {
    let limits: String = kinds
        .iter()
        .map(|k| format!("echo 0 > /proc/sys/user/max_{k}_namespaces && "))
        .collect();
    unshared(&["-U", "-r", "-m"], &limits, home, isolation, args)
}

/// `drivetrain ARGS` in `home` under `unshare FLAGS`, after the shell commands `setup`
/// (each ending in `&& `).
fn unshared(
    flags: &[&str],
    setup: &str,
    home: &Home,
    isolation: &str,
    args: &[&str],
) -> std::process::Output {
    std::process::Command::new("unshare")
        .args(flags)
        .args(["sh", "-c"])
        .arg(format!(r#"{setup}exec "$0" "$@""#))
        .arg(env!("CARGO_BIN_EXE_drivetrain"))
        .args(args)
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("DRIVETRAIN_ISOLATION", isolation)
        .env("NO_COLOR", "1")
        .output()
        .expect("unshare runs")
}

#[test]
fn a_refused_user_namespace_fails_a_required_stage_and_auto_says_what_it_has() {
    if !root_or_skip("user namespaces are refused from inside a namespace root makes") {
        return;
    }
    let home = Home::new("no-userns");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: no-userns\nstages:\n  a:\n    run: {command: [sh, -c, 'echo ran > \"$0/f\"', \"{{ outputs.o }}\"]}\n    outputs: [o]\n",
    );
    let file = file.to_str().unwrap();
    let o = without_user_namespaces(&home, "required", &["run", file]);
    let out = text(&o.stdout) + &text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("the kernel refused it a user namespace"),
        "{out}"
    );
    assert!(out.contains("DRIVETRAIN_ISOLATION=required"), "{out}");
    // `auto`: the mount namespace alone, which root can still make; the stage runs.
    let o = without_user_namespaces(&home, "auto", &["run", file]);
    assert_ok(&o);
    // And `doctor` says which layers there are, there and here.
    let layer = |o: std::process::Output, name: &str| doctor_layer(&o, name)["active"].clone();
    let doctor = || without_user_namespaces(&home, "auto", &["doctor", "-o", "json"]);
    assert_eq!(layer(doctor(), "user namespace"), false);
    assert_eq!(layer(doctor(), "mount namespace"), true);
    assert_eq!(layer(doctor(), "prepared sandboxes"), false);
    let here = || home.drivetrain(&["doctor", "-o", "json"]);
    assert_eq!(layer(here(), "prepared sandboxes"), true);
    assert_eq!(layer(here(), "user namespace"), true);
    assert_eq!(layer(here(), "pid namespace"), true);
    assert_eq!(layer(here(), "network namespace"), true);
    assert_eq!(layer(here(), "seccomp filter"), true);
}

#[test]
fn a_root_stage_cannot_undo_its_mounts() {
    if !root_or_skip("the probe is about stages of an engine running as root") {
        return;
    }
    let home = Home::new("escape");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: escape
stages:
  make:
    run: {command: [sh, -c, 'echo original > "$0/f"', "{{ outputs.data }}"]}
    outputs: [data]
  probe:
    inputs: {data: make.data}
    run:
      command:
        - sh
        - -c
        - |
          store=${DRIVETRAIN_STORE#file://}
          dot=$(cd "$store/.." && pwd)
          state="$dot/state.db"
          artifact=$(find "$store" -type f -name f | head -1)
          grep ^Cap /proc/self/status
          # Each attempt: if it works, the stage then tries to write through it.
          attempt() {
            what=$1; shift
            if "$@" 2>/dev/null; then
              if echo x >> "$artifact" 2>/dev/null || echo x >> "$state" 2>/dev/null; then
                echo "ESCAPED: $what"
              else
                echo "worked but wrote nothing: $what"
              fi
            else
              echo "refused: $what"
            fi
          }
          attempt "umount the home" umount -l "$dot"
          attempt "umount the store" umount -l "$store"
          attempt "remount the home rw" mount -o remount,bind,rw "$dot"
          attempt "tmpfs over the store" mount -t tmpfs tmpfs "$store"
          attempt "nsenter pid 1" nsenter -t 1 -m -- sh -c "echo x >> '$state'"
          attempt "a user namespace" unshare -Urm sh -c "umount -l '$dot' && echo x >> '$state'"
          escaped=
          for p in /proc/[0-9]*; do
            [ "$p" = /proc/$$ ] && continue
            if echo x >> "$p/root$state" 2>/dev/null; then escaped="$escaped $p"; fi
          done
          if [ -n "$escaped" ]; then echo "ESCAPED: /proc/PID/root of$escaped"; else echo "refused: /proc/PID/root"; fi
          echo x >> "$state" 2>/dev/null && echo "ESCAPED: state.db" || echo "refused: state.db"
          echo x >> "$artifact" 2>/dev/null && echo "ESCAPED: artifact" || echo "refused: artifact"
        - "{{ inputs.data }}"
  reader:
    needs: [probe]
    inputs: {data: make.data}
    run: {command: [cat, "{{ inputs.data }}/f"]}
"#,
    );
    // A root process with no capabilities (a browser's sandboxed helper, say): a stage
    // holding a superset of its capabilities could once enter its `/proc/PID/root`,
    // which is the engine's mount namespace, where the home is writable.
    let mut bare = std::process::Command::new("setpriv")
        .args(["--bounding-set=-all", "--inh-caps=-all", "sleep", "60"])
        .spawn()
        .expect("setpriv (util-linux) starts a process without capabilities");
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    let _ = bare.kill();
    let _ = bare.wait();
    assert_ok(&o);
    let id = run_id(&o);
    let probe = text(&home.drivetrain(&["logs", &id, "--stage", "probe"]).stdout);
    assert!(!probe.contains("ESCAPED"), "{probe}");
    for what in [
        "umount the home",
        "umount the store",
        "remount the home rw",
        "tmpfs over the store",
        "nsenter pid 1",
        "a user namespace",
        "/proc/PID/root",
        "state.db",
        "artifact",
    ] {
        assert!(
            probe.contains(&format!("refused: {what}")),
            "{what}: {probe}"
        );
    }
    // CAP_SYS_ADMIN (bit 21) is gone from the bounding set.
    let bounding = probe
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .expect("CapBnd line");
    assert_eq!(bounding & (1 << 21), 0, "{probe}");
    // What the stage tried to break is as it was.
    let reader = text(&home.drivetrain(&["logs", &id, "--stage", "reader"]).stdout);
    assert_eq!(reader, "original\n");
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Succeeded");
    let integrity = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('pragma integrity_check').fetchone()[0])",
        ])
        .arg(home.dir.join(".drivetrain/state.db"))
        .output()
        .unwrap();
    assert_eq!(text(&integrity.stdout), "ok\n");
}

/// An isolated attempt is started without `fork` (the engine clones the child onto its
/// memory, `posix_spawn`-style, and the child enters its namespaces before `exec`): it
/// must still start like any process would. Nothing blocked and `SIGPIPE` not ignored
/// (the engine ignores it, as Rust programs do), stdin at end of file, the program looked
/// up on the stage's own `PATH`, a script without `#!` run by `/bin/sh` (as `execvp`
/// does), and a file that cannot be executed named as such.
#[test]
fn an_isolated_stage_starts_like_any_process() {
    let userns = std::process::Command::new("unshare")
        .args(["-Urm", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !userns
        && !root_or_skip("no mount namespaces for this user here: nothing is isolated to check")
    {
        return;
    }
    let home = Home::new("clone-start");
    let bin = home.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = |name: &str, text: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt as _;
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    tool("with-shebang", "#!/bin/sh\necho \"from PATH: $1\"\n", 0o755);
    tool("without-shebang", "echo \"no #! line: $1\"\n", 0o755);
    tool("not-executable", "#!/bin/sh\necho never\n", 0o644);
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: clone-start
stages:
  signals:
    run: {{command: [grep, -E, '^Sig(Blk|Ign):', /proc/self/status]}}
  stdin:
    run: {{command: [sh, -c, 'cat; echo "stdin ended"']}}
  lookup:
    env: {{PATH: "{bin}:/usr/bin:/bin"}}
    run: {{command: [with-shebang, one]}}
  script:
    env: {{PATH: "{bin}:/usr/bin:/bin"}}
    run: {{command: [without-shebang, two]}}
"#,
            bin = bin.display()
        ),
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let id = run_id(&o);
    let log = |stage: &str| text(&home.drivetrain(&["logs", &id, "--stage", stage]).stdout);
    let signals = log("signals");
    let mask = |name: &str| {
        signals
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("{name} in {signals}"))
    };
    assert_eq!(mask("SigBlk:"), 0, "{signals}");
    // SIGPIPE is signal 13: bit 12.
    assert_eq!(mask("SigIgn:") & (1 << 12), 0, "{signals}");
    assert_eq!(log("stdin"), "stdin ended\n");
    assert_eq!(log("lookup"), "from PATH: one\n");
    assert_eq!(log("script"), "no #! line: two\n");

    let denied = home.write(
        "denied.yaml",
        &format!(
            "version: 1\nname: denied\nstages:\n  s:\n    env: {{PATH: \"{}\"}}\n    run: {{command: [not-executable]}}\n",
            bin.display()
        ),
    );
    let o = home.drivetrain_env(
        &["run", denied.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("stage `s`: command `not-executable` is not executable"),
        "{}",
        text(&o.stdout)
    );
}

/// A stage sees its own attempt only: another attempt's live log (unmasked until that
/// attempt ends), other work directories and the state database are not there for it,
/// while its own directory, checkpoints and inputs are (issue 26's cross-run secret).
#[test]
fn a_stage_cannot_read_other_attempts_or_the_state_database() {
    if !root_or_skip("the home is hidden in the attempt's mount namespace") {
        return;
    }
    let home = Home::new("hidden");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: hidden
stages:
  talker:
    run: {command: [sh, -c, 'echo "token=s3cr3t-$$"; sleep 3']}
  reader:
    run:
      command:
        - sh
        - -c
        - |
          sleep 1
          work=$(cd ../.. && pwd)
          echo "runs: $(ls "$work" | wc -l)"
          cat "$work"/*/*/log.txt 2>/dev/null | grep token= || echo "no token read"
          echo "state.db bytes: $(wc -c < "$work/../state.db")"
          echo mine > own.txt && cat own.txt
          echo nope > "$work/x" 2>/dev/null && echo "WROTE into the hidden dir" || echo "refused: hidden dir"
  after:
    needs: [reader]
    run: {command: [sh, -c, 'test -d "$DRIVETRAIN_CHECKPOINTS" && echo ok > "$DRIVETRAIN_CHECKPOINTS/c" && cat "$DRIVETRAIN_CHECKPOINTS/c"']}
"#,
    );
    // An earlier run's attempt, still running as far as its files go.
    let other = home
        .dir
        .join(".drivetrain/work/20261124-000000-other/train.1");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("log.txt"), "token=s3cr3t-of-another-run\n").unwrap();
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--parallelism", "2"],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let run = run_id(&o);
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "reader"]).stdout);
    assert!(log.contains("runs: 1"), "only its own run's folder: {log}");
    assert!(!log.contains("s3cr3t"), "{log}");
    assert!(log.contains("no token read"), "{log}");
    assert!(log.contains("state.db bytes: 0"), "{log}");
    assert!(log.contains("mine"), "its own directory is writable: {log}");
    assert!(log.contains("refused: hidden dir"), "{log}");
    let after = text(&home.drivetrain(&["logs", &run, "--stage", "after"]).stdout);
    assert!(after.contains("ok"), "checkpoints stay writable: {after}");
}

/// A secret mounted as files (`mount_path`) on the local executor: a read-only file per
/// key of `HOME/secrets/NAME/` on a tmpfs over the directory, masked in the log; the
/// directory's own files hidden meanwhile; the home's secrets hidden from every stage;
/// nothing of it left for the next attempt (the prepared sandbox detaches it).
#[test]
fn a_secret_mounted_as_files_is_the_attempts_alone_and_read_only() {
    if !root_or_skip("secrets are mounted in the attempt's mount namespace") {
        return;
    }
    let home = Home::new("secret-files");
    let keys = home.dir.join(".drivetrain/secrets/tls");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("token"), "tok-Zq81\n").unwrap();
    std::fs::write(keys.join("ca.pem"), "CERT-9fK2").unwrap();
    let mnt = home.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(mnt.join("decoy"), "on the host").unwrap();
    let yaml = format!(
        r#"
version: 1
name: secret-files
stages:
  read:
    secrets: [{{name: tls, mount_path: "{mnt}"}}]
    env: {{D: "{mnt}", S: "{keys}"}}
    run:
      command:
        - sh
        - -c
        - |
          cat "$D/token"; echo; cat "$D/ca.pem"; echo
          ls -A "$D" | tr '\n' ' '; echo
          echo "modes: $(stat -c %a "$D/token") $(stat -c %a "$D")"
          (echo x > "$D/token") 2>/dev/null && echo "WROTE the secret" || echo "refused: write"
          (touch "$D/new") 2>/dev/null && echo "ADDED a file" || echo "refused: add"
          cat "$S/token" 2>/dev/null || echo "refused: home secrets"
  after:
    needs: [read]
    env: {{D: "{mnt}"}}
    run: {{command: [sh, -c, 'echo "after: $(ls -A "$D" | tr "\n" " ")"']}}
"#,
        mnt = mnt.display(),
        keys = keys.display()
    );
    let file = home.write("p.yaml", &yaml);
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let run = run_id(&o);
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "read"]).stdout);
    assert!(
        log.starts_with("***\n***\n"),
        "values read, and masked: {log}"
    );
    assert!(
        !log.contains("tok-Zq81") && !log.contains("CERT-9fK2"),
        "{log}"
    );
    assert!(
        log.contains("ca.pem token \n"),
        "its keys alone, no decoy: {log}"
    );
    assert!(log.contains("modes: 400 500"), "{log}");
    for refused in ["refused: write", "refused: add", "refused: home secrets"] {
        assert!(log.contains(refused), "{refused}: {log}");
    }
    let after = text(&home.drivetrain(&["logs", &run, "--stage", "after"]).stdout);
    assert_eq!(
        after, "after: decoy \n",
        "nothing of the secret outlives its attempt"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("decoy")).unwrap(),
        "on the host"
    );
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        1,
        "nothing written on the host"
    );
    // Without a mount namespace the stage is refused, saying what works instead.
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "off")],
    );
    assert!(!o.status.success());
    let st = home.status(&run_id(&o));
    let reason = stage(&st, "read")["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("not supported by the `local` executor here") && reason.contains("`env:`"),
        "{reason}"
    );
}

/// A stage gets its stdio and no other descriptor (issue 46): a file its engine's caller
/// left open to the engine (here fd 9, a file only the caller may read) is closed at the
/// stage's `exec`, isolated or not.
#[test]
fn a_stage_inherits_no_descriptor_but_its_stdio() {
    let home = Home::new("descriptors");
    let secret = home.dir.join("callers-only.txt");
    std::fs::write(&secret, "CALLERS-SECRET-7Q").unwrap();
    let file = home.write(
        "p.yaml",
        "version: 1\nname: fds\nstages:\n  look:\n    run: {command: [sh, -c, 'cat <&9 2>/dev/null || echo \"fd 9 closed\"; ls /proc/self/fd | sort -n | tr \"\\n\" \" \"']}\n",
    );
    let modes: &[&str] = match nix::unistd::geteuid().is_root() {
        true => &["off", "required"],
        false => &["off"],
    };
    for isolation in modes {
        // The caller's shell opens fd 9 and execs the engine with it.
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"exec 9<"$SECRET"; exec "$ENGINE" run "$PIPELINE""#)
            .current_dir(&home.dir)
            .env("SECRET", &secret)
            .env("ENGINE", env!("CARGO_BIN_EXE_drivetrain"))
            .env("PIPELINE", &file)
            .env("DRIVETRAIN_ISOLATION", isolation)
            .env_remove("DRIVETRAIN_HOME")
            .output()
            .unwrap();
        assert_ok(&o);
        let log = text(
            &home
                .drivetrain(&["logs", &run_id(&o), "--stage", "look"])
                .stdout,
        );
        assert!(!log.contains("CALLERS-SECRET"), "{isolation}: {log}");
        assert!(log.contains("fd 9 closed"), "{isolation}: {log}");
        // `ls` itself holds one more (its directory): 0, 1, 2 and that one.
        let fds: Vec<&str> = log
            .lines()
            .last()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        assert_eq!(fds.len(), 4, "{isolation}: only stdio and ls's own: {log}");
    }
}

/// Homes are closed (issue 46): the engine makes its home 0700 and its state 0600, so a
/// stage of another home (host `nobody` under a root engine) lists no run and reads no
/// state, artifact or log of it, even by the exact path; `doctor` says whether a home is,
/// and an existing open one is said with the fix.
#[test]
fn a_stage_reads_nothing_of_another_home() {
    use std::os::unix::fs::PermissionsExt as _;
    if !root_or_skip("the stage is another user than the home's owner") {
        return;
    }
    let alpha = Home::new("private-alpha");
    let file = alpha.write(
        "p.yaml",
        "version: 1\nname: a\nstages:\n  s:\n    run: {command: [sh, -c, 'echo log-of-alpha; echo artifact-of-alpha > $DRIVETRAIN_OUTPUT_O/f']}\n    outputs: [o]\n",
    );
    assert_ok(&alpha.drivetrain(&["run", file.to_str().unwrap()]));
    let home = alpha.dir.join(".drivetrain");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("state.db")), 0o600);
    // Where alpha's artifact and log are, as someone who knows would name them.
    let holding = |dir: &std::path::Path, text: &str| {
        walk(dir)
            .into_iter()
            .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(text)))
            .unwrap_or_else(|| panic!("no file of {} holds {text}", dir.display()))
    };
    let artifact = holding(&home.join("artifacts"), "artifact-of-alpha");
    let log = holding(&home.join("work"), "log-of-alpha");
    let beta = Home::new("private-beta");
    let probe = format!(
        "version: 1\nname: b\nstages:\n  peek:\n    run: {{command: [sh, -c, 'ls {h} >/dev/null 2>&1 && echo LISTED; ls {h}/work >/dev/null 2>&1 && echo RUNS; cat {h}/state.db >/dev/null 2>&1 && echo READ; cat {a} {l} 2>/dev/null; echo done']}}\n",
        h = home.display(),
        a = artifact.display(),
        l = log.display()
    );
    let file = beta.write("p.yaml", &probe);
    let o = beta.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let log = text(
        &beta
            .drivetrain(&["logs", &run_id(&o), "--stage", "peek"])
            .stdout,
    );
    assert_eq!(log, "done\n", "another home is closed to the stage: {log}");
    let doctor = alpha.drivetrain(&["doctor", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(v["home"]["private"], true, "{v}");
    // An existing home left open: said, with the fix, by the engine and by `doctor`.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = alpha.drivetrain(&["list"]);
    assert!(text(&o.stderr).contains("chmod 700"), "{}", text(&o.stderr));
    let doctor = alpha.drivetrain(&["doctor", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(
        (&v["home"]["private"], &v["home"]["mode"]),
        (&serde_json::json!(false), &serde_json::json!("755")),
        "{v}"
    );
}

/// One hostile stage per way out that issue 26 found with the engine running as root,
/// each refused or contained, and the run truthful about it: the stage is root in its own
/// namespaces and host `nobody` outside them, in a PID namespace of its own whose every
/// process ends with the stage.
#[test]
fn a_root_stage_reaches_nothing_of_the_hosts_and_nothing_outlives_it() {
    if !root_or_skip("the stage user of a root engine is the point") {
        return;
    }
    const SECRET: &str = "grandchild-Zk4";
    let home = Home::new("contained");
    let other = Home::new("contained-other");
    let other_db = other.write("state.db", "another engine's state\n");
    let outside = home.dir.with_extension("outside");
    std::fs::write(&outside, "root's file\n").unwrap();
    let core_pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    // A process of the engine's user outside the attempt, its secret on its command line.
    let mut victim = std::process::Command::new("bash")
        .args(["-c", "exec -a 'sleep --token=victim-secret' sleep 60"])
        .spawn()
        .unwrap();
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: contained
stages:
  attack:
    secrets: [{name: db, key: password, env: DB_PASSWORD}]
    outputs: [o]
    run:
      command:
        - sh
        - -c
        - |
          out=$0
          try() { what=$1; shift; if "$@" 2>/dev/null; then echo "ESCAPED: $what"; else echo "refused: $what"; fi; }
          echo "uid in its namespace: $(id -u)"
          try "sysctl" sh -c "echo '|/tmp/helper' > /proc/sys/kernel/core_pattern"
          try "sysrq" sh -c "echo h > /proc/sysrq-trigger"
          try "a host file" sh -c "echo x >> $OUTSIDE"
          try "/etc" sh -c "echo x >> /etc/hostname"
          try "the engine binary" sh -c "printf '' >> $ENGINE"
          try "another home" sh -c "echo x >> $OTHER_DB"
          try "stop a process outside" kill -STOP "$VICTIM"
          try "kill a process outside" kill -9 "$VICTIM"
          try "read its command line" grep -q token "/proc/$VICTIM/cmdline"
          try "a host block device" sh -c "ls /dev | grep -qE '^(loop|vd|sd|nvme|xvd)'"
          echo "devices: $(ls /dev | tr '\n' ' ')"
          echo "processes seen: $(ls /proc | grep -c '^[0-9]')"
          echo published > "$out/f"
          echo "uid_map:$(tr -s ' ' < /proc/self/uid_map)"
          # Outlive the attempt: rewrite the published output, then print the secret.
          setsid sh -c 'sleep 2; echo tampered > "$0/f"; echo "late $DB_PASSWORD"' "$out" &
          echo "stage done"
        - "{{ outputs.o }}"
  reader:
    inputs: {o: attack.o}
    run: {command: [sh, -c, 'sleep 3; cat "$0/f"', "{{ inputs.o }}"]}
"#,
    );
    let engine = env!("CARGO_BIN_EXE_drivetrain");
    let victim_pid = victim.id().to_string();
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[
            ("DRIVETRAIN_ISOLATION", "required"),
            ("DRIVETRAIN_SECRET_DB_PASSWORD", SECRET),
            ("OUTSIDE", outside.to_str().unwrap()),
            ("ENGINE", engine),
            ("OTHER_DB", other_db.to_str().unwrap()),
            ("VICTIM", &victim_pid),
        ],
    );
    // The grandchild would have struck by now.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let victim_alive = victim.try_wait().unwrap().is_none();
    let victim_state =
        std::fs::read_to_string(format!("/proc/{victim_pid}/stat")).unwrap_or_default();
    let _ = victim.kill();
    let _ = victim.wait();
    assert_ok(&o);
    let id = run_id(&o);
    let log = text(&home.drivetrain(&["logs", &id, "--stage", "attack"]).stdout);
    assert!(!log.contains("ESCAPED"), "{log}");
    for what in [
        "sysctl",
        "sysrq",
        "a host file",
        "/etc",
        "the engine binary",
        "another home",
        "stop a process outside",
        "kill a process outside",
        "read its command line",
        "a host block device",
    ] {
        assert!(log.contains(&format!("refused: {what}")), "{what}: {log}");
    }
    assert!(log.contains("uid in its namespace: 0"), "{log}");
    // A /dev of its own: the usual nodes, no disk of the host's.
    assert!(
        log.contains(
            "devices: fd full null ptmx pts random shm stderr stdin stdout tty urandom zero"
        ),
        "{log}"
    );
    // `sh`, `ls` and `grep`: nothing of the host's.
    let seen: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("processes seen: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a count");
    assert!(seen <= 4, "{log}");
    assert!(victim_alive, "the process outside the attempt was killed");
    let state = victim_state
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .trim_start();
    assert!(!state.starts_with('T'), "stopped: {victim_state}");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(),
        core_pattern
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "root's file\n");
    assert_eq!(
        std::fs::read_to_string(&other_db).unwrap(),
        "another engine's state\n"
    );
    // The grandchild ended with the stage: the output as published, no late line.
    let reader = text(&home.drivetrain(&["logs", &id, "--stage", "reader"]).stdout);
    assert_eq!(reader, "published\n");
    assert!(!log.contains("late"), "{log}");
    let published = home
        .dir
        .join(format!(".drivetrain/artifacts/runs/{id}/attack/1/o/f"));
    assert_eq!(std::fs::read_to_string(&published).unwrap(), "published\n");
    // The stage wrote it as host nobody; published, it is the engine's again (no other
    // process that runs as nobody on the host owns an artifact).
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(&published).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let map = format!("uid_map: 0 {} 1", drivetrain_executors::local::STAGE_ID);
    assert!(log.contains(&map), "{log}");
    // And the secret is nowhere under the home.
    let grep = std::process::Command::new("grep")
        .args(["-r", "-l", SECRET])
        .arg(home.dir.join(".drivetrain"))
        .output()
        .unwrap();
    assert!(grep.stdout.is_empty(), "{}", text(&grep.stdout));
    let _ = std::fs::remove_file(&outside);
}

/// `resources` are limits on the local executor (cgroups; v1 on this machine and CI):
/// 1 GiB touched under `memory: 64Mi` is killed by the kernel and reported as out of
/// memory, retried under `retries.on: [oom]`; a 2,000-process fork storm stops at the
/// pids limit and the failure says so; and nothing of either is left behind.
#[test]
fn resources_are_enforced_and_an_oom_kill_is_reported_as_such() {
    let Some(home) = cgroup_home("resources") else {
        return;
    };
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: resources
stages:
  hog:
    resources: {memory: 64Mi}
    retries: {limit: 1, on: [oom], backoff: 0s}
    run: {command: [python3, -c, "b = bytearray(1 << 30); b[::4096] = b'x' * (len(b) // 4096); print('touched 1 GiB')"]}
  storm:
    run:
      command: [sh, -c, 'i=0; while [ $i -lt 2000 ]; do sleep 30 & i=$((i+1)); done; echo "all started"']
  small:
    resources: {memory: 64Mi, cpu: "0.5"}
    run: {command: [python3, -c, "b = bytearray(8 << 20); print('fits')"]}
  each:
    map: {items: [4, 12]}
    run: {command: [python3, -c, "import sys; b = bytearray(int(sys.argv[1]) << 20)", "{{ item }}"]}
"#,
    );
    // Spawned, not `drivetrain_env`: its PID names the cgroups it keeps for its attempts.
    let engine = std::process::Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["run", file.to_str().unwrap()])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("NO_COLOR", "1")
        .env("DRIVETRAIN_ISOLATION", "required")
        .env("DRIVETRAIN_PIDS_MAX", "200")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = engine.id();
    let o = engine.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let id = run_id(&o);
    let st = home.status(&id);
    let hog = stage(&st, "hog");
    assert_eq!(hog["phase"], "Failed", "{st}");
    assert_eq!(hog["attempts"], 2, "retried on oom: {st}");
    assert_eq!(hog["exit_code"], 137);
    let reason = hog["reason"].as_str().unwrap();
    assert!(reason.starts_with("out of memory (limit 64Mi)"), "{reason}");
    let storm = stage(&st, "storm");
    assert_eq!(storm["phase"], "Failed", "{st}");
    let reason = storm["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused at the limit of 200 processes"),
        "{reason}"
    );
    assert!(
        !text(&home.drivetrain(&["logs", &id, "--stage", "storm"]).stdout).contains("all started")
    );
    let small = stage(&st, "small");
    assert_eq!(small["phase"], "Succeeded", "{st}");
    // What it used, from its cgroups: at least the 8 MiB it made, some CPU time.
    let peak = small["usage"]["peak_memory_bytes"]
        .as_u64()
        .expect("a peak");
    assert!((8 << 20..64 << 20).contains(&peak), "{st}");
    assert!(
        small["usage"]["cpu_seconds"].as_f64().unwrap() > 0.0,
        "{st}"
    );
    let status = text(&home.drivetrain(&["status", &id]).stdout);
    assert!(status.contains("used: peak "), "{status}");
    // A map stage's items: the largest item's peak (the 12 MiB one), all items' CPU.
    assert!(status.contains("items used: peak "), "{status}");
    let each = &st["item_usage"]["each"];
    let peak = each["peak_memory_bytes"].as_u64().expect("a peak");
    assert!((12 << 20..64 << 20).contains(&peak), "{st}");
    assert!(each["cpu_seconds"].as_f64().unwrap() > 0.0, "{st}");
    // No `sleep 30` of the storm is left, and no cgroup of the run.
    let left = std::process::Command::new("pgrep")
        .args(["-c", "-f", "^sleep 30$"])
        .output()
        .unwrap();
    assert_eq!(text(&left.stdout).trim(), "0");
    let cgroups = std::process::Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "6", "-type", "d", "-name"])
        .arg(format!("{id}*"))
        .output()
        .unwrap();
    assert_eq!(text(&cgroups.stdout), "");
    // Nor a cgroup the engine kept for its next attempts (`drivetrain/PID/slot-N`), once
    // it has exited. Its own only: an engine another test killed leaves its slots to the
    // next engine that starts.
    let slots = std::process::Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "8", "-type", "d", "-path"])
        .arg(format!("*/drivetrain/{pid}/slot-*"))
        .output()
        .unwrap();
    let left = text(&slots.stdout);
    assert_eq!(left, "", "the cgroups of engine {pid}");
}

/// A home for a test of the engine's cgroups, where it makes them: as root, on a machine
/// with cgroups (CI's has both).
fn cgroup_home(name: &str) -> Option<Home> {
    if !root_or_skip("the engine makes cgroups as root") {
        return None;
    }
    let home = Home::new(name);
    cgroups_or_skip(&home).then_some(home)
}

/// Whether the engine gives stages cgroups here (CI's machine does). Asked of the engine,
/// not of this process (on cgroup v2 the engine moves into a leaf of its cgroup to hand
/// controllers on).
fn cgroups_or_skip(home: &Home) -> bool {
    let cgroups = cgroup_layer(home.drivetrain(&["doctor", "-o", "json"]));
    if cgroups["active"] != true {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI's machine has cgroups: {cgroups}"
        );
        eprintln!("no cgroups here, skipped: {cgroups}");
        return false;
    }
    true
}

/// An attempt's cgroups serve the next attempt once it has ended (v1: making and removing
/// them was a third of a millisecond per stage), and the next one counts only its own:
/// after a stage that burnt half a second of CPU and held 32 MiB, and one killed for its
/// 64 MiB limit, a hook in the same cgroups (its `/proc/self/cgroup` says so) has neither
/// their CPU time, nor their peak, nor their OOM kill; and the next hook holds 96 MiB, past
/// the limit the killed stage had.
#[test]
fn an_ended_attempts_cgroups_serve_the_next_one_which_counts_only_its_own() {
    let Some(home) = cgroup_home("cgroup-reuse") else {
        return;
    };
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: reuse
stages:
  burn:
    run: {command: [python3, -c, "import time\nb = bytearray(32 << 20)\nb[::4096] = b'x' * (len(b) // 4096)\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\nprint(open('/proc/self/cgroup').read())"]}
  hog:
    needs: [burn]
    resources: {memory: 64Mi}
    run: {command: [python3, -c, "b = bytearray(1 << 30); b[::4096] = b'x' * (len(b) // 4096)"]}
  after:
    hook: finally
    run: {command: [sh, -c, 'cat /proc/self/cgroup; exit 3']}
  big:
    hook: finally
    run: {command: [python3, -c, "print(open('/proc/self/cgroup').read())\nb = bytearray(96 << 20)\nb[::4096] = b'x' * (len(b) // 4096)\nprint('96 MiB under no limit')"]}
"#,
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--parallelism", "1"],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let id = run_id(&o);
    let st = home.status(&id);
    let burn = stage(&st, "burn");
    assert_eq!(burn["phase"], "Succeeded", "{st}");
    assert!(
        burn["usage"]["cpu_seconds"].as_f64().unwrap() >= 0.45,
        "{st}"
    );
    assert!(
        burn["usage"]["peak_memory_bytes"].as_u64().unwrap() >= 32 << 20,
        "{st}"
    );
    let hog = stage(&st, "hog");
    let reason = hog["reason"].as_str().unwrap();
    assert!(reason.starts_with("out of memory (limit 64Mi)"), "{reason}");
    let after = stage(&st, "after");
    let reason = after["reason"].as_str().unwrap();
    assert!(reason.starts_with("exited with code 3\n"), "{reason}");
    assert!(
        after["usage"]["cpu_seconds"].as_f64().unwrap() < 0.3,
        "{st}"
    );
    assert!(
        after["usage"]["peak_memory_bytes"].as_u64().unwrap() < 16 << 20,
        "{st}"
    );
    // The same cgroups: the first and the last stage name the same ones.
    let cgroup = |stage: &str| {
        let log = text(&home.drivetrain(&["logs", &id, "--stage", stage]).stdout);
        let pids: Vec<String> = log
            .lines()
            .filter(|l| l.contains(":pids:"))
            .map(str::to_owned)
            .collect();
        assert_eq!(pids.len(), 1, "{log}");
        pids[0].clone()
    };
    assert!(
        cgroup("burn").contains("/drivetrain/"),
        "{}",
        cgroup("burn")
    );
    // `drivetrain/PID/slot-N`: the shape the resources test looks for once its engine has
    // exited, so that its finding nothing means something.
    assert!(cgroup("burn").contains("/slot-"), "{}", cgroup("burn"));
    assert_eq!(cgroup("burn"), cgroup("after"));
    // The next hook, in the same cgroups still, has no memory limit: hog's 64 MiB is gone.
    assert_eq!(cgroup("burn"), cgroup("big"));
    let big = stage(&st, "big");
    assert_eq!(big["phase"], "Succeeded", "{st}");
    assert!(
        big["usage"]["peak_memory_bytes"].as_u64().unwrap() >= 96 << 20,
        "{st}"
    );
}

/// `network: none` gives a stage a network namespace of its own with loopback only: the
/// engine's machine's loopback services and interfaces are not there for it, its own
/// loopback is; a stage without it (the default, `host`) reaches the service.
#[test]
fn network_none_leaves_a_stage_its_own_loopback_only() {
    if !root_or_skip("network namespaces are made by the root engine's stages") {
        return;
    }
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port().to_string();
    let home = Home::new("network");
    let probe = r#"
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    print("reached the host's service")
except OSError as e:
    print("refused:", e.strerror)
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
socket.create_connection(own.getsockname(), timeout=2).close()
print("own loopback works")
print("interfaces:", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
"#;
    let file = home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: network\nstages:\n  cut:\n    network: none\n    run: {{command: [python3, -c, {probe:?}, \"{port}\"]}}\n  open:\n    run: {{command: [python3, -c, {probe:?}, \"{port}\"]}}\n"
        ),
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let id = run_id(&o);
    let cut = text(&home.drivetrain(&["logs", &id, "--stage", "cut"]).stdout);
    assert!(cut.contains("refused: Connection refused"), "{cut}");
    assert!(cut.contains("own loopback works"), "{cut}");
    assert!(cut.contains("interfaces: ['lo']"), "{cut}");
    let open = text(&home.drivetrain(&["logs", &id, "--stage", "open"]).stdout);
    assert!(open.contains("reached the host's service"), "{open}");
    drop(service);
}

/// Where the host gives no cgroups (here: the engine runs in a mount namespace whose
/// `/sys/fs/cgroup` is an empty tmpfs), `doctor` says so, `required` fails the stage
/// naming the layer, and `auto` runs it with a line in its log saying its `resources`
/// are not enforced: never silently.
#[test]
fn without_cgroups_resources_are_said_to_be_unenforced() {
    if !root_or_skip("the cgroups are hidden from inside a mount namespace root makes") {
        return;
    }
    let home = Home::new("no-cgroups");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: no-cgroups\nstages:\n  a:\n    resources: {memory: 64Mi}\n    run: {command: [echo, ran]}\n",
    );
    let without = |isolation: &str, args: &[&str]| hiding("/sys/fs/cgroup", &home, isolation, args);
    let layer = cgroup_layer(without("auto", &["doctor", "-o", "json"]));
    assert_eq!(layer["active"], false, "{layer}");
    assert!(
        layer["what"].as_str().unwrap().contains("not enforced"),
        "{layer}"
    );
    let file = file.to_str().unwrap();
    let o = without("required", &["run", file]);
    let out = text(&o.stdout) + &text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("DRIVETRAIN_ISOLATION=required"), "{out}");
    let o = without("auto", &["run", file]);
    assert_ok(&o);
    let log = text(
        &home
            .drivetrain(&["logs", &run_id(&o), "--stage", "a"])
            .stdout,
    );
    assert!(log.contains("`resources` are not enforced here"), "{log}");
    assert!(log.contains("ran"), "{log}");
}

/// `drivetrain ARGS` in `home` in a mount namespace of its own whose `hidden` is an empty
/// tmpfs (a host without those cgroups).
fn hiding(hidden: &str, home: &Home, isolation: &str, args: &[&str]) -> std::process::Output {
    let setup = format!("mount -t tmpfs none {hidden} && ");
    unshared(&["-m"], &setup, home, isolation, args)
}

/// The `cgroup limits` layer of a `doctor -o json` report.
fn cgroup_layer(doctor: std::process::Output) -> serde_json::Value {
    doctor_layer(&doctor, "cgroup limits")
}

/// A host whose cgroups lack a controller (here: the v1 `pids` hierarchy hidden; on v2, a
/// parent that delegates only `memory`, as a lent GPU machine's does) still limits what it
/// can, and says what it cannot: `doctor` names the controller, `required` fails the stage
/// naming it, `auto` runs it with a line in its log.
#[test]
fn a_missing_pids_controller_is_said_and_required_refuses() {
    if !root_or_skip("the pids hierarchy is hidden from inside a mount namespace root makes") {
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/pids").is_dir() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI's machine has v1 cgroups with a pids hierarchy"
        );
        eprintln!("no v1 pids hierarchy here to hide, skipped");
        return;
    }
    let home = Home::new("no-pids");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: no-pids\nstages:\n  a:\n    resources: {memory: 64Mi}\n    run: {command: [echo, ran]}\n",
    );
    let without =
        |isolation: &str, args: &[&str]| hiding("/sys/fs/cgroup/pids", &home, isolation, args);
    let layer = cgroup_layer(without("auto", &["doctor", "-o", "json"]));
    assert_eq!(layer["active"], true, "{layer}");
    let what = layer["what"].as_str().unwrap();
    assert!(
        what.contains("not the pids controller here: no limit on an attempt's processes"),
        "{layer}"
    );
    let file = file.to_str().unwrap();
    let o = without("required", &["run", file]);
    let out = text(&o.stdout) + &text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("the host's cgroups have no pids controller"),
        "{out}"
    );
    let o = without("auto", &["run", file]);
    assert_ok(&o);
    let id = run_id(&o);
    let log = text(&home.drivetrain(&["logs", &id, "--stage", "a"]).stdout);
    assert!(
        log.contains("drivetrain: the host's cgroups have no pids controller"),
        "{log}"
    );
    // The memory limit it could set is still there: the stage's usage is recorded.
    let st = home.status(&id);
    assert!(
        stage(&st, "a")["usage"]["peak_memory_bytes"].is_u64(),
        "{st}"
    );
}

/// With PID and network namespaces refused (here: `user.max_pid_namespaces` and
/// `max_net_namespaces` 0 in a user namespace made for the engine), `doctor` says so, `auto`
/// runs a stage without them, and a `network: none` stage fails saying why instead of
/// running connected.
#[test]
fn refused_pid_and_network_namespaces_are_said_and_network_none_is_never_ignored() {
    if !root_or_skip("the namespaces are refused from inside a namespace root makes") {
        return;
    }
    let home = Home::new("no-pidns");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: no-pidns\nstages:\n  a:\n    run: {command: [sh, -c, 'echo ran']}\n",
    );
    let cut = home.write(
        "cut.yaml",
        "version: 1\nname: cut\nstages:\n  a:\n    network: none\n    run: {command: [echo, ran]}\n",
    );
    let run = |file: &std::path::Path| {
        refusing(
            &["pid", "net"],
            &home,
            "auto",
            &["run", file.to_str().unwrap()],
        )
    };
    let doctor = refusing(&["pid", "net"], &home, "auto", &["doctor", "-o", "json"]);
    let active = |name: &str| doctor_layer(&doctor, name)["active"].clone();
    assert_eq!(active("pid namespace"), false);
    assert_eq!(active("network namespace"), false);
    assert_eq!(active("mount namespace"), true);
    let o = run(&file);
    assert_ok(&o);
    let o = run(&cut);
    let out = text(&o.stdout) + &text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("has `network: none`, and this engine cannot give it a network namespace (the kernel refused one)"),
        "{out}"
    );
}
