//! The values of a stage's declared secrets, replaced by `***` (the convention of Argo and
//! GitHub Actions) in everything the engine keeps or shows: its log (as it is written,
//! [`Stream`]: `logs --follow` and the API never see a value either), its failure reason
//! and its values.

use std::path::Path;

use serde_json::Value;

/// The secrets to mask; cheap to clone. Its `Debug` never shows them.
#[derive(Clone, Default)]
pub struct Mask(std::sync::Arc<Vec<String>>);

impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mask({} secret(s))", self.0.len())
    }
}

impl Mask {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Mask {
        let mut v: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        // Longest first: a secret that contains another is masked whole.
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        v.dedup();
        Mask(std::sync::Arc::new(v))
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` masked, or `None` when it holds no secret.
    pub fn bytes(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        for secret in self.0.iter() {
            let src = out.as_deref().unwrap_or(text);
            let needle = secret.as_bytes();
            if !src.windows(needle.len()).any(|w| w == needle) {
                continue;
            }
            let mut masked = Vec::with_capacity(src.len());
            let mut i = 0;
            while i < src.len() {
                if src[i..].starts_with(needle) {
                    masked.extend_from_slice(b"***");
                    i += needle.len();
                } else {
                    masked.push(src[i]);
                    i += 1;
                }
            }
            out = Some(masked);
        }
        out
    }

    pub fn text(&self, text: &str) -> String {
        match self.bytes(text.as_bytes()) {
            Some(b) => String::from_utf8_lossy(&b).into_owned(),
            None => text.to_owned(),
        }
    }

    pub fn json(&self, v: &mut Value) {
        if self.0.is_empty() {
            return;
        }
        match v {
            Value::String(s) => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|i| self.json(i)),
            Value::Object(m) => m.values_mut().for_each(|i| self.json(i)),
            _ => {}
        }
    }

    /// Masks a file in place (a new file renamed over it, so a reader sees either), read
    /// and written a piece at a time, so a file of any size takes little memory; left as
    /// it is when it holds no secret.
    pub fn file(&self, path: &Path) {
        use std::io::{Read as _, Write as _};
        if self.0.is_empty() {
            return;
        }
        let Ok(mut input) = std::fs::File::open(path) else {
            return;
        };
        let tmp = path.with_extension("masked");
        let Ok(out) = std::fs::File::create(&tmp) else {
            return;
        };
        let mut out = std::io::BufWriter::new(out);
        let mut stream = self.stream();
        let mut piece = vec![0u8; Stream::HOLD];
        let copied = loop {
            match input.read(&mut piece) {
                Ok(0) => break out.write_all(&stream.finish()).and_then(|_| out.flush()),
                Ok(n) => {
                    if let Err(e) = out.write_all(&stream.push(&piece[..n])) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if copied.is_ok() && stream.masked {
            let _ = std::fs::rename(&tmp, path);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// A masking pass over output as it comes, in pieces.
    pub fn stream(&self) -> Stream {
        Stream {
            mask: self.clone(),
            held: Vec::new(),
            masked: false,
        }
    }
}

/// Output masked as it is written: whole lines go out masked at once; a line longer than
/// [`Stream::HOLD`] goes out in pieces, each cut before any secret it may be the start of.
pub struct Stream {
    mask: Mask,
    held: Vec<u8>,
    /// Whether anything that went out had a secret masked.
    pub masked: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({} byte(s) held)", self.held.len())
    }
}

impl Stream {
    /// The longest unfinished line held back before a piece of it goes out.
    pub const HOLD: usize = 64 * 1024;

    /// Takes `chunk`; returns what may be written now, masked.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let before = self.held.len();
        self.held.extend_from_slice(chunk);
        let cut = match chunk.iter().rposition(|b| *b == b'\n') {
            Some(newline) => before + newline + 1,
            None if self.held.len() > Self::HOLD => self.safe_cut(),
            None => 0,
        };
        self.take(cut)
    }

    /// What is left at the end, masked.
    pub fn finish(&mut self) -> Vec<u8> {
        self.take(self.held.len())
    }

    /// Where an unfinished line may be cut: before the last bytes that could begin a
    /// secret, and before any secret that crosses that point.
    fn safe_cut(&self) -> usize {
        let longest = self.mask.0.first().map_or(0, String::len);
        let mut cut = self.held.len().saturating_sub(longest.saturating_sub(1));
        // A secret that starts before the cut and ends after it moves the cut before it,
        // which may put the cut inside another one: until none crosses it.
        loop {
            let crossing = self.mask.0.iter().find_map(|secret| {
                let n = secret.len();
                (cut.saturating_sub(n - 1)..cut)
                    .find(|&s| self.held[s..].starts_with(secret.as_bytes()) && s + n > cut)
            });
            match crossing {
                Some(start) => cut = start,
                None => return cut,
            }
        }
    }

    fn take(&mut self, cut: usize) -> Vec<u8> {
        let out: Vec<u8> = self.held.drain(..cut).collect();
        match self.mask.bytes(&out) {
            Some(masked) => {
                self.masked = true;
                masked
            }
            None => out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Mask;

    /// A file far longer than a piece, with secrets on lines longer than a piece and
    /// across pieces' ends, comes out as masking it whole would make it; a file with no
    /// secret is not rewritten.
    #[test]
    fn a_file_is_masked_piece_by_piece_as_if_whole() {
        use std::os::unix::fs::MetadataExt as _;
        let m = Mask::new(["tok-9f8e7d".to_owned()]);
        let dir = std::env::temp_dir().join(format!("dt-mask-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let mut text = Vec::new();
        for i in 0..200_000u32 {
            text.extend_from_slice(format!("{i} tok-9f8e7d ").as_bytes());
            if i % 7_001 == 0 {
                text.push(b'\n');
            }
        }
        std::fs::write(&path, &text).unwrap();
        m.file(&path);
        assert_eq!(std::fs::read(&path).unwrap(), m.bytes(&text).unwrap());
        let clean = dir.join("clean");
        std::fs::write(&clean, "nothing secret\n".repeat(10_000)).unwrap();
        let inode = std::fs::metadata(&clean).unwrap().ino();
        m.file(&clean);
        assert_eq!(std::fs::metadata(&clean).unwrap().ino(), inode);
        assert!(!dir.join("clean.masked").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_are_masked_in_text_bytes_and_json() {
        let m = Mask::new(["s3cr3t".to_owned(), "s3cr3t-long".to_owned(), String::new()]);
        assert_eq!(
            m.text("token=s3cr3t-long and s3cr3t, s3cr3ts3cr3t"),
            "token=*** and ***, ******"
        );
        // Bytes that are not UTF-8 around a secret stay as they were.
        let raw = [b"\xff\xfe ".as_slice(), b"s3cr3t", b" \xff"].concat();
        assert_eq!(m.bytes(&raw).unwrap(), b"\xff\xfe *** \xff");
        assert!(m.bytes(b"nothing here").is_none());
        let mut v = serde_json::json!({"a": ["x s3cr3t"], "b": {"c": "s3cr3t"}, "n": 1});
        m.json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": ["x ***"], "b": {"c": "***"}, "n": 1})
        );
        // No secrets: nothing changes, the empty value included.
        assert_eq!(Mask::new(Vec::new()).text("s3cr3t"), "s3cr3t");
        assert!(!format!("{m:?}").contains("s3cr3t"));
    }

    /// Output cut anywhere (one byte at a time, across a secret, in one long line with no
    /// newline) comes out exactly as masking it whole would.
    #[test]
    fn a_stream_masks_as_masking_the_whole_would_wherever_it_is_cut() {
        let m = Mask::new(["s3cr3t-value".to_owned(), "tok".to_owned()]);
        let long_line = "x".repeat(super::Stream::HOLD - 5) + "s3cr3t-value tail tok";
        let text =
            format!("a s3cr3t-value b\nno newline tok s3cr3t-va{long_line}\nlast s3cr3t-value");
        let whole = m.text(&text);
        for size in [1, 2, 5, 11, 4096, 70_000] {
            let mut s = m.stream();
            let mut out = Vec::new();
            for piece in text.as_bytes().chunks(size) {
                out.extend(s.push(piece));
            }
            out.extend(s.finish());
            assert_eq!(String::from_utf8(out).unwrap(), whole, "pieces of {size}");
        }
    }
}
