//! JSON bodies for the answers hyper writes on its own.
//!
//! When a request line or its headers cannot be parsed (garbage, an absurd
//! `Content-Length`, headers too large), hyper answers 400, 431 or the like with an
//! empty body before any handler runs, and offers no hook to change that answer. SPEC
//! section 2 wants every non-200 body to be `{"error": ...}`, so the connection's writes
//! pass through [`JsonErrorIo`], which recognises such an answer (a 4xx or 5xx with
//! `content-length: 0`, which no route of ours sends) and writes the same status with
//! a JSON body saying what to fix instead. The connection closes after it, as hyper
//! closes it after a parse error anyway.

use std::io;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;

/// Longest answer head hyper writes for its own errors; anything longer is passed on.
const HEAD_BYTES_MAX: usize = 512;

/// A connection whose empty-bodied error answers from hyper get a JSON body.
pub struct JsonErrorIo<T> {
    inner: T,
    /// Bytes of a rewritten answer that the socket has not taken yet.
    pending: Vec<u8>,
    written: usize,
}

impl<T> JsonErrorIo<T> {
    /// Wraps a connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// What to tell a client whose request hyper refused with `status`.
fn advice(status: u16) -> &'static str {
    match status {
        400 => {
            "malformed request: the request line or a header could not be parsed (check the method, path, HTTP version and Content-Length); send a valid HTTP/1.1 request"
        }
        408 => "the request did not arrive in time; send it again",
        413 => "the request is too large; split it",
        414 => "the request path is too long; shorten it",
        431 => "the request headers are too large; send fewer or shorter headers",
        505 => "unsupported HTTP version; use HTTP/1.1",
        _ => "the request could not be processed; check it and send it again",
    }
}

/// The replacement for `head` when it is an error answer of hyper's own: same status
/// line, a JSON body, `connection: close`.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"HTTP/1.") || head.len() > HEAD_BYTES_MAX || !head.ends_with(b"\r\n\r\n")
    {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let status_line = text.split("\r\n").next()?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next()?;
    let status: u16 = parts.next()?.parse().ok()?;
    if !version.starts_with("HTTP/1.") || !(400..600).contains(&status) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") || lower.contains("\r\ncontent-type:") {
        return None;
    }
    let body = format!("{{\"error\":{:?}}}", advice(status));
    let date = text
        .split("\r\n")
        .find(|line| line.to_ascii_lowercase().starts_with("date:"));
    let mut answer = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(date) = date {
        answer.push_str(date);
        answer.push_str("\r\n");
    }
    answer.push_str("\r\n");
    answer.push_str(&body);
    Some(answer.into_bytes())
}

impl<T: AsyncWrite + Unpin> JsonErrorIo<T> {
    /// Writes what is left of a rewritten answer; ready once all of it is out.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = match Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonErrorIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonErrorIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        // hyper writes an answer's head in one call (vectored writes are off), so a
        // whole error answer arrives here at once.
        if let Some(answer) = rewrite(buf) {
            this.pending = answer;
            // The rewritten answer counts as written; poll_flush sends what is left.
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_error_answers_get_a_json_body() {
        let head =
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Tue, 24 Nov 2026 01:00:00 GMT\r\n\r\n";
        let answer = String::from_utf8(rewrite(head).expect("rewritten")).expect("utf-8");
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains("content-type: application/json\r\n"),
            "{answer}"
        );
        assert!(answer.contains("connection: close\r\n"), "{answer}");
        assert!(answer.contains("date: Tue, 24 Nov 2026"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).expect("a body");
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert!(
            json["error"]
                .as_str()
                .is_some_and(|e| e.contains("malformed"))
        );
        let length: usize = answer
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.parse().ok())
            .expect("content-length");
        assert_eq!(length, body.len());
    }

    #[test]
    fn answers_of_our_routes_pass_unchanged() {
        for head in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: 70\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{partial",
        ] {
            assert!(rewrite(head).is_none(), "{}", String::from_utf8_lossy(head));
        }
    }
}
