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
pub struct LineReader<R> {
    inner: BufReader<R>,
    max: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Lines of `inner`, at most `max` bytes each.
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner: BufReader::with_capacity(64 << 10, inner),
            max,
        }
    }

    /// The next line; `None` at end of file. Blank lines are skipped.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let mut line = Vec::new();
            let mut length = 0usize;
            let mut too_long = false;
            let mut ended = false;
            loop {
                let available = self.inner.fill_buf().await?;
                if available.is_empty() {
                    ended = true;
                    break;
                }
                let (chunk, used, complete) = match available.iter().position(|&b| b == b'\n') {
                    Some(at) => (&available[..at], at + 1, true),
                    None => (available, available.len(), false),
                };
                length += chunk.len();
                if length > self.max {
                    too_long = true;
                    line = Vec::new();
                } else if !too_long {
                    line.extend_from_slice(chunk);
                }
                self.inner.consume(used);
                if complete {
                    break;
                }
            }
            if too_long {
                return Ok(Some(Line::TooLong(length)));
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                if ended {
                    return Ok(None);
                }
                continue;
            }
            return Ok(Some(Line::Message(line)));
        }
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
}
