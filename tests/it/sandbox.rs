//! Prepared sandboxes (executors/src/local/sandbox.rs): attempts of a root engine enter a
//! PID and mount namespace made once for the home instead of building their own, and
//! nothing of one attempt is there for the next.

use crate::common;
use crate::isolation::root_or_skip;

use common::*;

/// `drivetrain run FILE` in `home`, isolated as the engine decides, its output piped.
fn spawn_engine(home: &Home, file: &std::path::Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["run", file.to_str().unwrap()])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_ISOLATION")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The pid of the child of process `parent` whose command line has `what` in it.
fn child_of(parent: u32, what: &str) -> String {
    let o = std::process::Command::new("ps")
        .args(["-o", "pid=,args=", "--ppid", &parent.to_string()])
        .output()
        .unwrap();
    let children = text(&o.stdout);
    children
        .lines()
        .find(|l| l.contains(what))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {what} among the children of {parent}: {children}"))
        .to_owned()
}

/// What a sandbox's init has in its command line.
const INIT: &str = "__drivetrain-sandbox-init";

/// A chain of two stages at `--parallelism 1`: the second runs in the sandbox the first
/// ran in (the same PID namespace, which neither is the host's), and finds none of what
/// the first left: its `setsid` process (gone from the host too), its `/dev/shm` file, its
/// work directory; it does not see the sandbox's init either.
#[test]
fn a_sandbox_serves_attempt_after_attempt_and_keeps_nothing_of_one_for_the_next() {
    if !root_or_skip("sandboxes are made for a root engine's attempts") {
        return;
    }
    let home = Home::new("sandbox");
    let marker = format!("sandbox-leftover-{}", std::process::id());
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: sandbox
stages:
  first:
    run:
      command:
        - sh
        - -c
        - |
          echo "pid namespace: $(readlink /proc/self/ns/pid)"
          echo left > /dev/shm/left-by-first
          setsid sh -c 'sleep 300; : {marker}' &
          sleep 0.2
          echo "first sees: $(ls /proc | grep -c '^[0-9]') processes"
  second:
    needs: [first]
    run:
      command:
        - sh
        - -c
        - |
          echo "pid namespace: $(readlink /proc/self/ns/pid)"
          echo "shm: [$(ls -A /dev/shm)]"
          echo "attempts: $(ls .. | tr '\n' ' ')"
          grep -l '[{first}]{rest}' /proc/[0-9]*/cmdline 2>/dev/null || echo "no leftover process"
          test -e /proc/1 && echo "init visible" || echo "init hidden"
"#,
            first = &marker[..1],
            rest = &marker[1..],
        ),
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--parallelism", "1"],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let run = run_id(&o);
    let log = |stage: &str| text(&home.drivetrain(&["logs", &run, "--stage", stage]).stdout);
    let (first, second) = (log("first"), log("second"));
    let ns = |log: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix("pid namespace: "))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no namespace in {log}"))
    };
    let host = std::fs::read_link("/proc/self/ns/pid").unwrap();
    assert_eq!(ns(&first), ns(&second), "one sandbox: {first}\n{second}");
    assert_ne!(ns(&first), host.to_string_lossy(), "{first}");
    assert!(first.contains("first sees: "), "{first}");
    assert!(second.contains("shm: []"), "{second}");
    assert!(
        second.contains("attempts: second.1 second.checkpoints "),
        "{second}"
    );
    assert!(second.contains("no leftover process"), "{second}");
    assert!(second.contains("init hidden"), "{second}");
    let host_leftover = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        host_leftover.stdout.is_empty(),
        "still running on the host: {}",
        text(&host_leftover.stdout)
    );
}

/// An isolated stage gets a `/dev` of its own, which covers a home under `/dev/shm`: the
/// stage would not find its own output directory there. The run says so, naming the
/// path, instead of the stage failing on a missing directory.
#[test]
fn a_home_under_dev_is_refused_with_the_reason() {
    if !root_or_skip("an engine that can isolate its stages") {
        return;
    }
    let dir = std::path::PathBuf::from(format!(
        "/dev/shm/drivetrain-devhome-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.yaml");
    std::fs::write(
        &file,
        "version: 1\nname: d\nstages:\n  a:\n    outputs: [o]\n    run: {command: [sh, -c, 'echo hi > \"$0/f\"', '{{ outputs.o }}']}\n",
    )
    .unwrap();
    let home = dir.join("h");
    let run = |isolation: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args([
                "--home",
                home.to_str().unwrap(),
                "run",
                file.to_str().unwrap(),
            ])
            .env("DRIVETRAIN_ISOLATION", isolation)
            .output()
            .unwrap();
        (
            o.status.success(),
            format!("{}{}", text(&o.stdout), text(&o.stderr)),
        )
    };
    let (ok, out) = run("auto");
    assert!(!ok, "{out}");
    assert!(
        out.contains("is under /dev, /proc or /sys") && out.contains(&home.display().to_string()),
        "{out}"
    );
    // Without isolation the same home works.
    let (ok, out) = run("off");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{out}");
}

/// An engine killed with SIGKILL takes its sandboxes along: each init reads the end of
/// its control socket and exits, and the kernel ends every process in its PID namespace,
/// the attempt's too (`resume` runs it again as a lost attempt).
#[test]
fn a_killed_engine_leaves_no_sandbox_and_no_stage_behind() {
    if !root_or_skip("sandboxes are made for a root engine's attempts") {
        return;
    }
    let home = Home::new("sandbox-kill9");
    let started = home.dir.join("started");
    let file = home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: k\nstages:\n  a:\n    run: {{command: [sh, -c, 'echo started > {}; exec sleep 300.303']}}\n",
            started.display()
        ),
    );
    let mut engine = spawn_engine(&home, &file);
    wait_for_file(&started);
    // The engine's children: its sandbox's init and the stage's process.
    let (init, stage) = (
        child_of(engine.id(), INIT),
        child_of(engine.id(), "sleep 300.303"),
    );
    engine.kill().unwrap();
    engine.wait().unwrap();
    assert!(
        wait_dead(&init),
        "the sandbox's init {init} outlived its engine"
    );
    assert!(wait_dead(&stage), "the stage {stage} outlived its engine");
}

/// The seccomp filter refuses a namespace through `clone` (`unshare` and `setns` were
/// refused already) and answers `clone3` with "not implemented", whose flags it cannot
/// read; threads and child processes still start (the C library falls back to `clone`).
#[test]
fn a_stage_cannot_make_namespaces_through_clone() {
    if !root_or_skip("a root engine's stage with every layer") || std::env::consts::ARCH != "x86_64"
    {
        return;
    }
    let home = Home::new("clone-ns");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: clone-ns
stages:
  probe:
    run:
      command:
        - python3
        - -c
        - |
          import ctypes, os, subprocess, threading
          libc = ctypes.CDLL(None, use_errno=True)
          r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
          if r == 0:
              os._exit(0)
          print("clone with CLONE_NEWUSER:", r, ctypes.get_errno())
          r = libc.syscall(435, None, 0)  # clone3
          print("clone3:", r, ctypes.get_errno())
          t = threading.Thread(target=lambda: print("a thread ran"))
          t.start(); t.join()
          print("a child exited", subprocess.run(["true"]).returncode)
"#,
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    assert_ok(&o);
    let log = text(
        &home
            .drivetrain(&["logs", &run_id(&o), "--stage", "probe"])
            .stdout,
    );
    assert!(
        log.contains("clone with CLONE_NEWUSER: -1 1\n"),
        "EPERM: {log}"
    );
    assert!(log.contains("clone3: -1 38\n"), "ENOSYS: {log}");
    assert!(log.contains("a thread ran"), "{log}");
    assert!(log.contains("a child exited 0"), "{log}");
}

/// An idle sandbox whose init was killed is not used again: a retried stage's second
/// attempt, after its sandbox's init was killed during the back-off, runs in a new one,
/// without first failing to start in the dead one.
#[test]
fn a_sandbox_whose_init_was_killed_is_not_taken_again() {
    if !root_or_skip("sandboxes are made for a root engine's attempts") {
        return;
    }
    let home = Home::new("sandbox-dead-init");
    let first = home.dir.join("first-ns");
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: dead-init
stages:
  a:
    retries: {{limit: 1, backoff: 3s, on: [failed]}}
    run:
      command:
        - sh
        - -c
        - |
          if [ -e {first} ]; then echo "second: $(readlink /proc/self/ns/pid)"; exit 0; fi
          echo "first: $(readlink /proc/self/ns/pid)" > {first}.tmp && mv {first}.tmp {first}
          exit 1
"#,
            first = first.display()
        ),
    );
    let engine = spawn_engine(&home, &file);
    wait_for_file(&first);
    // The first attempt has ended and its sandbox is idle: kill its init.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let init = child_of(engine.id(), INIT);
    let killed = std::process::Command::new("kill")
        .args(["-9", &init])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = engine.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stdout));
    let run = run_id(&out);
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "a"]).stdout);
    let first = std::fs::read_to_string(&first).unwrap();
    let ns = |text: &str, which: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(which))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no `{which}` in {text}"))
    };
    assert_ne!(
        ns(&first, "first: "),
        ns(&log, "second: "),
        "{first}\n{log}"
    );
    // Not found out by failing to start in it (the fallback that would say so).
    let err = text(&out.stderr);
    assert!(!err.contains("in its sandbox"), "{err}");
}
