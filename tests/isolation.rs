//! A stage started by an engine running as root cannot undo the mounts that make the
//! store and the engine's home read-only for it (issue 16's probe).
//!
//! CI runs as root, which is the case this is about: a root stage kept `CAP_SYS_ADMIN`
//! and could `umount -l` the read-only bind of the home, then overwrite artifacts and rows
//! of `state.db` while its run reported Succeeded. The test runs with
//! `DRIVETRAIN_ISOLATION=required`, so it fails rather than passes vacuously where no
//! namespace can be had; as another user it says so and checks nothing (that case is the
//! user-namespace path, whose attempt drops its capabilities at `exec` anyway).

mod common;

use common::*;

#[test]
fn a_root_stage_cannot_undo_its_mounts() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: the probe is about stages of an engine running as root");
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
