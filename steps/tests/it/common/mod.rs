//! What the steps' test binaries share: a fresh scratch directory and a runtime.
#![allow(dead_code)] // each test binary uses its own share of these

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// An empty directory of its own for one test of this process, removed when the test
/// ends (kept where the test failed, to be looked at).
pub fn tmp(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("dt-steps-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// A test's scratch directory ([`tmp`]).
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A runtime for the async step functions.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Writes an MCAP file with the Python `mcap` package's writer: `messages` in the order
/// given (`topic`, `encoding`, `log_time` in ns, `data` text), each channel with a schema
/// of the profile's encoding; `chunk_size` small puts messages in chunks of their own;
/// `compression` is `NONE`, `ZSTD` or `LZ4`.
pub fn python_mcap(
    path: &Path,
    profile: &str,
    chunk_size: u64,
    compression: &str,
    messages: &[Value],
) {
    const SCRIPT: &str = r#"
import json, sys
from mcap.writer import Writer, CompressionType
spec = json.load(sys.stdin)
with open(spec["path"], "wb") as f:
    w = Writer(f, chunk_size=spec["chunk_size"], compression=CompressionType[spec["compression"]])
    w.start(profile=spec["profile"], library="python mcap test writer")
    channels = {}
    for m in spec["messages"]:
        key = (m["topic"], m["encoding"])
        if key not in channels:
            schema_encoding = {"json": "jsonschema", "ros1": "ros1msg", "protobuf": "protobuf"}[m["encoding"]]
            sid = w.register_schema(name=m["topic"].strip("/") or "x", encoding=schema_encoding, data=b"{}")
            channels[key] = w.register_channel(topic=m["topic"], message_encoding=m["encoding"], schema_id=sid)
        w.add_message(channel_id=channels[key], log_time=m["log_time"], publish_time=m["log_time"], data=m["data"].encode())
    w.finish()
"#;
    let spec = json!({"path": path, "profile": profile, "chunk_size": chunk_size, "compression": compression, "messages": messages});
    let mut child = Command::new(drivetrain_engine::testing::venv_bin("python"))
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .spawn()
        .expect("the tests' venv python");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), spec.to_string().as_bytes()).unwrap();
    drop(child.stdin.take());
    assert!(
        child.wait().unwrap().success(),
        "the python mcap writer failed"
    );
}
