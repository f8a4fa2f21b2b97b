//! A stream whose writes fail once they have waited too long: an HTTP client
//! that stops reading (an SSE stream never drained) loses its connection
//! instead of holding the host's buffers and tasks for ever (security case
//! E65). Reads pass through; hyper's own header timeout covers slow requests.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner`, with writes (and flushes) that fail after waiting `timeout`.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimeout<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            waiting: None,
        }
    }

    /// Poll a write-side operation, starting the clock when it first waits.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(&mut self.inner, cx) {
            Poll::Ready(result) => {
                self.waiting = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let waiting = self
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.waiting = None;
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the client read nothing for {}",
                                humantime::format_duration(timeout)
                            ),
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

use std::future::Future as _;

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.guard(cx, |inner, cx| Pin::new(inner).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.guard(cx, |inner, cx| Pin::new(inner).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.guard(cx, |inner, cx| Pin::new(inner).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_timeout() {
        let (writer, _reader) = tokio::io::duplex(16);
        let mut writer = WriteTimeout::new(writer, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let error = writer.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn writes_that_are_read_go_through() {
        use tokio::io::AsyncReadExt;
        let (writer, mut reader) = tokio::io::duplex(16);
        let mut writer = WriteTimeout::new(writer, Duration::from_millis(200));
        let read = tokio::spawn(async move {
            let mut all = Vec::new();
            reader.read_to_end(&mut all).await.unwrap();
            all
        });
        writer.write_all(&[7u8; 1000]).await.unwrap();
        writer.shutdown().await.unwrap();
        drop(writer);
        assert_eq!(read.await.unwrap().len(), 1000);
    }
}
