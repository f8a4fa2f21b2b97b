//! Newline-delimited JSON-RPC framing with a bounded line length, for both
//! directions of stdio: a client's stdin and an executor's stdout. A line past
//! the bound is skipped to its end without being kept, and reported, so a
//! 100 MB line costs a bounded buffer, never the host.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest message box reads, from a client or from an executor. A file
/// read (1 MiB, base64) or a 1 MiB process write fits many times over.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// One line read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line (without its `\n` or a trailing `\r`).
    Message(Vec<u8>),
    /// A line longer than the bound, skipped; its length.
    TooLong(usize),
}

/// Reads lines of at most `max` bytes.
///
/// [`next`](Self::next) is cancel-safe: a line read in part when its future
/// is dropped (a `select!` that took another branch) is kept, and the next
/// call goes on with it.
pub struct LineReader<R> {
    inner: BufReader<R>,
    max: usize,
    /// How much of a line past `max` is kept ([`Self::too_long_head`]).
    head: usize,
    /// The line being read: its bytes are consumed from `inner` as they are
    /// copied here, so they must outlive a cancelled `next`.
    line: Vec<u8>,
    /// Its length so far (past `max`, only counted).
    length: usize,
    /// The first `head` bytes of the last line skipped as too long.
    skipped: Vec<u8>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Lines of `inner`, at most `max` bytes each.
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner: BufReader::with_capacity(64 << 10, inner),
            max,
            head: 0,
            line: Vec::new(),
            length: 0,
            skipped: Vec::new(),
        }
    }

    /// Keep the first `bytes` bytes of a line skipped as too long, so its
    /// reader can still find what the line was (a request's `id`).
    pub fn keeping_head(mut self, bytes: usize) -> Self {
        self.head = bytes;
        self
    }

    /// The kept start of the last line that was [`Line::TooLong`] (empty
    /// unless [`Self::keeping_head`] asked for it).
    pub fn too_long_head(&self) -> &[u8] {
        &self.skipped
    }

    /// The next line; `None` at end of file. Blank lines are skipped; an
    /// unterminated last line is still a line.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                return Ok(self.finish());
            }
            let (chunk, used, complete) = match available.iter().position(|&b| b == b'\n') {
                Some(at) => (&available[..at], at + 1, true),
                None => (available, available.len(), false),
            };
            self.length += chunk.len();
            if self.length > self.max {
                self.line.truncate(self.head);
                let room = self.head - self.line.len();
                self.line.extend_from_slice(&chunk[..room.min(chunk.len())]);
            } else {
                self.line.extend_from_slice(chunk);
            }
            self.inner.consume(used);
            if complete && let Some(line) = self.finish() {
                return Ok(Some(line));
            }
        }
    }

    /// The line read so far, ended: `None` when it is blank.
    fn finish(&mut self) -> Option<Line> {
        let length = std::mem::take(&mut self.length);
        let mut line = std::mem::take(&mut self.line);
        if length > self.max {
            self.skipped = line;
            return Some(Line::TooLong(length));
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(Line::Message(line))
    }
}

/// Write one message as a line and flush it.
pub async fn write_line<W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &serde_json::Value,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    writer.write_all(&bytes).await?;
    writer.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_skipped_and_reading_goes_on() {
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"a\":1}\r\n\n");
        input.extend(std::iter::repeat_n(b'x', 1000));
        input.extend_from_slice(b"\n{\"b\":2}");
        let mut reader = LineReader::new(&input[..], 100);
        assert_eq!(
            reader.next().await.unwrap(),
            Some(Line::Message(b"{\"a\":1}".to_vec()))
        );
        assert_eq!(reader.next().await.unwrap(), Some(Line::TooLong(1000)));
        assert_eq!(
            reader.next().await.unwrap(),
            Some(Line::Message(b"{\"b\":2}".to_vec()))
        );
        assert_eq!(reader.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_long_lines_head_is_kept_when_asked() {
        let mut input = b"{\"id\":7,".to_vec();
        input.extend(std::iter::repeat_n(b'x', 1000));
        input.extend_from_slice(b"\nend");
        let mut reader = LineReader::new(&input[..], 100).keeping_head(8);
        assert_eq!(reader.next().await.unwrap(), Some(Line::TooLong(1008)));
        assert_eq!(reader.too_long_head(), b"{\"id\":7,");
        assert_eq!(
            reader.next().await.unwrap(),
            Some(Line::Message(b"end".to_vec()))
        );
        assert_eq!(reader.next().await.unwrap(), None);
    }

    /// A `next` dropped in the middle of a line loses none of it.
    #[tokio::test]
    async fn a_cancelled_read_keeps_the_line_so_far() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut reader = LineReader::new(server, 100);
        client.write_all(b"{\"a\":").await.unwrap();
        let cancelled =
            tokio::time::timeout(std::time::Duration::from_millis(20), reader.next()).await;
        assert!(cancelled.is_err(), "{cancelled:?}");
        client.write_all(b"1}\n").await.unwrap();
        assert_eq!(
            reader.next().await.unwrap(),
            Some(Line::Message(b"{\"a\":1}".to_vec()))
        );
    }
}
