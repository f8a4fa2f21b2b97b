//! Whole-line framing over a byte stream, with one reused buffer.
//!
//! [`LineReader::next_line`] yields a line only once its newline has arrived;
//! the line then stays current (and is yielded again) until the caller
//! [`consume`](LineReader::consume)s it. That is how the relay keeps a line it
//! could not deliver whole and delivers it again on the next connection. Bytes
//! of an unfinished line at the end of the stream are reported and discarded,
//! never yielded.
//!
//! `next_line` is cancel-safe (it keeps its state between awaits), so it can
//! sit in a `select!`.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The buffer's starting size; it grows for long lines up to the reader's
/// limit and shrinks back afterwards.
const INITIAL_CAPACITY: usize = 64 << 10;

/// What [`LineReader::next_line`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEvent {
    /// A whole line, newline included, is current: [`LineReader::line`].
    Line,
    /// A line longer than the limit was read and dropped (up to and including
    /// its newline); `bytes` is its length.
    TooLong {
        /// How long the dropped line was.
        bytes: usize,
    },
    /// The stream ended; `partial` bytes of an unfinished line were dropped.
    End {
        /// How many bytes the unfinished last line had (0 when the stream
        /// ended on a line boundary).
        partial: usize,
    },
}

/// Reads whole lines from `R`.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    buffer: Vec<u8>,
    /// The unconsumed bytes are `buffer[start..end]`.
    start: usize,
    end: usize,
    /// Bytes from `start` already searched for a newline.
    scanned: usize,
    /// The current whole line's length (from `start`), until consumed.
    current: Option<usize>,
    /// Dropping an over-long line: how many bytes so far.
    dropping: Option<usize>,
    limit: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// A reader yielding lines of at most `limit` bytes (newline included).
    pub fn new(inner: R, limit: usize) -> Self {
        Self {
            inner,
            buffer: vec![0; INITIAL_CAPACITY.min(limit.max(1))],
            start: 0,
            end: 0,
            scanned: 0,
            current: None,
            dropping: None,
            limit,
        }
    }

    /// Waits for the next whole line (or the current one, if not consumed).
    pub async fn next_line(&mut self) -> std::io::Result<LineEvent> {
        loop {
            if self.current.is_some() {
                return Ok(LineEvent::Line);
            }
            if let Some(event) = self.scan() {
                return Ok(event);
            }
            self.make_room();
            let read = self.inner.read(&mut self.buffer[self.end..]).await?;
            if read == 0 {
                let partial = self.end - self.start + self.dropping.take().unwrap_or(0);
                self.start = 0;
                self.end = 0;
                self.scanned = 0;
                return Ok(LineEvent::End { partial });
            }
            self.end += read;
        }
    }

    /// The current whole line, newline included (empty when there is none).
    pub fn line(&self) -> &[u8] {
        match self.current {
            Some(length) => &self.buffer[self.start..self.start + length],
            None => &[],
        }
    }

    /// Done with the current line: the next call reads past it.
    pub fn consume(&mut self) {
        if let Some(length) = self.current.take() {
            self.start += length;
            self.scanned = 0;
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
                if self.buffer.len() > INITIAL_CAPACITY {
                    self.buffer.truncate(INITIAL_CAPACITY);
                    self.buffer.shrink_to_fit();
                }
            }
        }
    }

    /// Changes the longest line accepted from now on.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// The stream, for the caller to take back (unconsumed bytes are lost).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Looks for a newline in what is buffered; sets the current line or
    /// advances an over-long one being dropped.
    fn scan(&mut self) -> Option<LineEvent> {
        let unscanned = &self.buffer[self.start + self.scanned..self.end];
        match unscanned.iter().position(|&byte| byte == b'\n') {
            Some(offset) => {
                let length = self.scanned + offset + 1;
                self.scanned = 0;
                if let Some(dropped) = self.dropping.take() {
                    self.start += length;
                    return Some(LineEvent::TooLong {
                        bytes: dropped + length,
                    });
                }
                if length > self.limit {
                    self.start += length;
                    return Some(LineEvent::TooLong { bytes: length });
                }
                self.current = Some(length);
                Some(LineEvent::Line)
            }
            None => {
                self.scanned = self.end - self.start;
                if self.dropping.is_some() || self.scanned >= self.limit {
                    *self.dropping.get_or_insert(0) += self.scanned;
                    self.start = 0;
                    self.end = 0;
                    self.scanned = 0;
                }
                None
            }
        }
    }

    /// Moves unconsumed bytes to the front and grows the buffer when full.
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buffer.len() {
            let grown = (self.buffer.len() * 2).min(self.limit.saturating_add(1));
            self.buffer.resize(grown.max(self.end + 1), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Reads `chunks` (each written separately) and returns what the reader
    /// yielded, lines as text.
    async fn read_all(chunks: &[&[u8]], limit: usize) -> Vec<String> {
        let (mut writer, reader) = tokio::io::duplex(7);
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        let feeder = tokio::spawn(async move {
            for chunk in chunks {
                writer.write_all(&chunk).await.unwrap();
            }
        });
        let mut lines = LineReader::new(reader, limit);
        let mut seen = Vec::new();
        loop {
            match lines.next_line().await.unwrap() {
                LineEvent::Line => {
                    seen.push(String::from_utf8_lossy(lines.line()).into_owned());
                    lines.consume();
                }
                LineEvent::TooLong { bytes } => seen.push(format!("<too long: {bytes}>")),
                LineEvent::End { partial } => {
                    seen.push(format!("<end, {partial} partial>"));
                    break;
                }
            }
        }
        feeder.await.unwrap();
        seen
    }

    #[tokio::test]
    async fn lines_split_across_reads_come_out_whole() {
        let seen = read_all(&[b"{\"a\":", b"1}\n{\"b\"", b":2}\n\n!{}\n"], 1024).await;
        assert_eq!(
            seen,
            [
                "{\"a\":1}\n",
                "{\"b\":2}\n",
                "\n",
                "!{}\n",
                "<end, 0 partial>"
            ]
        );
    }

    #[tokio::test]
    async fn an_unfinished_last_line_is_dropped_not_yielded() {
        let seen = read_all(&[b"one\ntw", b"o"], 1024).await;
        assert_eq!(seen, ["one\n", "<end, 3 partial>"]);
    }

    #[tokio::test]
    async fn an_over_long_line_is_dropped_whole_and_the_next_is_intact() {
        let long = vec![b'x'; 100];
        let seen = read_all(&[b"ok\n", &long, b"yz\nafter\n"], 16).await;
        assert_eq!(
            seen,
            ["ok\n", "<too long: 103>", "after\n", "<end, 0 partial>"]
        );
        let seen = read_all(&[b"0123456789abcdef\n", b"0123456789abcde\n"], 16).await;
        assert_eq!(
            seen,
            ["<too long: 17>", "0123456789abcde\n", "<end, 0 partial>"]
        );
    }

    #[tokio::test]
    async fn a_line_longer_than_the_first_buffer_grows_it_and_then_shrinks() {
        let long = vec![b'y'; INITIAL_CAPACITY * 3];
        let mut input = long.clone();
        input.push(b'\n');
        input.extend_from_slice(b"short\n");
        let seen = read_all(&[&input], 1 << 20).await;
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0].len(), long.len() + 1);
        assert_eq!(seen[1], "short\n");
    }

    #[tokio::test]
    async fn an_unconsumed_line_is_yielded_again() {
        let mut lines = LineReader::new(&b"first\nsecond\n"[..], 64);
        assert_eq!(lines.next_line().await.unwrap(), LineEvent::Line);
        assert_eq!(lines.line(), b"first\n");
        assert_eq!(lines.next_line().await.unwrap(), LineEvent::Line);
        assert_eq!(lines.line(), b"first\n");
        lines.consume();
        assert_eq!(lines.next_line().await.unwrap(), LineEvent::Line);
        assert_eq!(lines.line(), b"second\n");
        lines.consume();
        assert_eq!(lines.line(), b"");
        assert_eq!(
            lines.next_line().await.unwrap(),
            LineEvent::End { partial: 0 }
        );
    }

    #[tokio::test]
    async fn next_line_is_cancel_safe() {
        let (mut writer, reader) = tokio::io::duplex(64);
        let mut lines = LineReader::new(reader, 64);
        writer.write_all(b"hel").await.unwrap();
        // A select that gives up while half a line is buffered loses nothing.
        tokio::select! {
            biased;
            _ = lines.next_line() => panic!("no whole line yet"),
            () = tokio::task::yield_now() => {}
        }
        writer.write_all(b"lo\n").await.unwrap();
        assert_eq!(lines.next_line().await.unwrap(), LineEvent::Line);
        assert_eq!(lines.line(), b"hello\n");
    }
}
