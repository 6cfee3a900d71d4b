//! The client socket's read side through a per-thread buffer: each socket `read` lands
//! in the worker thread's scratch buffer and is handed to the reader (hyper for the
//! request head, then tungstenite) from there. Only bytes the reader has not taken yet
//! are kept per connection, so an idle connection holds no read room here, and
//! tungstenite's own buffer (`flow.ws_read_buffer_bytes`, the most it takes per call)
//! can stay small without one socket `read` per few hundred bytes.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes one socket `read` takes; also the most a connection keeps between reads
/// (what its reader has not taken yet).
pub const SCRATCH_BYTES: usize = 16 * 1024;

thread_local! {
    /// The worker thread's read room, shared by every connection it polls.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_BYTES].into_boxed_slice());
}

/// A socket whose reads go through the thread's scratch buffer ([`SCRATCH_BYTES`]).
pub struct PooledRead<S> {
    io: S,
    /// Read from the socket, not yet taken by the reader: `pending[taken..]`. `None`
    /// (no allocation) whenever the reader took everything, which is the idle state.
    pending: Option<Box<[u8]>>,
    taken: usize,
}

impl<S> PooledRead<S> {
    /// Wraps `io`.
    pub fn new(io: S) -> Self {
        PooledRead {
            io,
            pending: None,
            taken: 0,
        }
    }

    /// Bytes read from the socket and not yet handed to the reader.
    pub fn pending(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.len() - self.taken)
    }

    /// Hands `buf` what it can take of the pending bytes.
    fn take_pending(&mut self, buf: &mut ReadBuf<'_>) {
        let Some(p) = &self.pending else {
            return;
        };
        let rest = &p[self.taken..];
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.taken += n;
        if self.taken == p.len() {
            self.pending = None;
            self.taken = 0;
        }
    }
}

impl<S: AsyncRead + Unpin> PooledRead<S> {
    /// One socket read into `scratch`; what `buf` cannot take is kept as pending.
    fn read_via(
        &mut self,
        scratch: &mut [u8],
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut rb = ReadBuf::new(scratch);
        match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let got = rb.filled();
                let n = got.len().min(buf.remaining());
                buf.put_slice(&got[..n]);
                if n < got.len() {
                    self.pending = Some(got[n..].into());
                    self.taken = 0;
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PooledRead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            this.take_pending(buf);
            return Poll::Ready(Ok(()));
        }
        // A reader with room of its own (or none at all) reads straight from the socket.
        if buf.remaining() == 0 || buf.remaining() >= SCRATCH_BYTES {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let via = SCRATCH.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => Some(this.read_via(&mut scratch, cx, buf)),
            Err(_) => None,
        });
        match via {
            Ok(Some(r)) => r,
            // The thread's buffer is gone (thread exit) or in use: read directly.
            _ => Pin::new(&mut this.io).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PooledRead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_get_every_byte_in_order_and_keep_nothing_after() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&data).await.expect("write");
        drop(client);
        let mut r = PooledRead::new(server);
        let mut got = Vec::new();
        let mut chunk = [0u8; 300];
        loop {
            let n = r.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
            assert!(r.pending() < SCRATCH_BYTES);
        }
        assert_eq!(got, data);
        assert_eq!(r.pending(), 0);
        assert!(
            r.pending.is_none(),
            "nothing held once everything was taken"
        );
    }

    #[tokio::test]
    async fn a_large_reader_reads_directly() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client.write_all(&[7u8; 1000]).await.expect("write");
        let mut r = PooledRead::new(server);
        let mut big = vec![0u8; SCRATCH_BYTES];
        let n = r.read(&mut big).await.expect("read");
        assert_eq!(n, 1000);
        assert!(r.pending.is_none());
    }
}
