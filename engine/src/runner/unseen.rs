//! Containment's part in a failed stage: a stage that fails on a file the engine's machine
//! has ("No such file or directory", "Permission denied", "not found") may have failed
//! because containment hid it or closed the way to it. The code cannot tell; the engine
//! can. The absolute paths the log's last lines name in such an error are asked of the
//! executor ([`crate::executor::Executor::unseen`]), and what it says joins the reason.

use std::path::PathBuf;

use crate::executor::{Executor, PathAccess};

/// Words of an error about a file the process could not find or open.
const MISSING: [&str; 6] = [
    "No such file",
    "Permission denied",
    "not found",
    "can't open",
    "cannot open",
    "cannot access",
];

/// The most paths asked about.
const ASKED: usize = 4;

/// The absolute paths named in the lines of `tail` that report a missing or forbidden
/// file, each once, in order.
pub(super) fn named_paths(tail: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in tail
        .lines()
        .filter(|l| MISSING.iter().any(|m| l.contains(m)))
    {
        for word in line.split(|c: char| c.is_whitespace() || "'\"`()[],;=".contains(c)) {
            let word = word.trim_end_matches([':', '.']);
            if !word.starts_with('/') || word.len() < 2 {
                continue;
            }
            let path = PathBuf::from(word);
            if !out.contains(&path) && out.len() < ASKED {
                out.push(path);
            }
        }
    }
    out
}

/// What containment did to the paths `tail` names, as lines to add to a stage's reason
/// (empty when it did nothing to them).
pub(super) fn note(executor: &dyn Executor, access: &[PathAccess], tail: &str) -> String {
    named_paths(tail)
        .iter()
        .filter_map(|p| executor.unseen(p, access))
        .map(|why| format!("\n{why}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::named_paths;

    /// The shapes of the messages of sh, cat, Python and ls: the path, without quotes
    /// or a trailing colon, once.
    #[test]
    fn paths_are_found_in_error_lines_only() {
        let tail = "\
loading /data/ok.txt
cat: /root/data/x.txt: Permission denied
python3: can't open file '/root/train.py': [Errno 2] No such file or directory
sh: 1: /root/venv/bin/python: not found
FileNotFoundError: [Errno 2] No such file or directory: '/root/data/a.json'
ls: cannot access '/root/data/x.txt': Permission denied
";
        let found: Vec<String> = named_paths(tail)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "/root/data/x.txt",
                "/root/train.py",
                "/root/venv/bin/python",
                "/root/data/a.json"
            ]
        );
    }
}
