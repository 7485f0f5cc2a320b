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

mod common;

use common::*;

/// Whether this test runs as root; when not, it is skipped with `why`, except under
/// `CI=true`, where it fails: the isolation tests must never pass without checking.
fn root_or_skip(why: &str) -> bool {
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
    std::process::Command::new("unshare")
        .args(["-U", "-r", "-m", "sh", "-c"])
        .arg(r#"echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" "$@""#)
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
    let layer = |o: std::process::Output, name: &str| -> serde_json::Value {
        assert_ok(&o);
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let found = report["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == name);
        found.unwrap_or_else(|| panic!("{name}: {report}"))["active"].clone()
    };
    let doctor = || without_user_namespaces(&home, "auto", &["doctor", "-o", "json"]);
    assert_eq!(layer(doctor(), "user namespace"), false);
    assert_eq!(layer(doctor(), "mount namespace"), true);
    let here = || home.drivetrain(&["doctor", "-o", "json"]);
    assert_eq!(layer(here(), "user namespace"), true);
    assert_eq!(layer(here(), "pid namespace"), false, "not built yet");
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
