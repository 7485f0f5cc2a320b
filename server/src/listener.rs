//! The HTTP listener of `serve` and `ui`: what keeps the server answering when clients
//! hold connections they never use.
//!
//! - **Headers within [`HEADER_TIMEOUT`]**: a connection that has not sent a whole
//!   request head by then (the first one or the next one on a kept-alive connection) is
//!   closed, by hyper's own timer; a body within [`BODY_TIMEOUT`] after that, or the
//!   request is answered as a body that could not be read.
//! - **A bounded number of connections** ([`Limits::connections`], from the file limit,
//!   which [`raise_file_limit`] lifts to the hard limit first), and of those with no
//!   request in progress ([`Limits::idle`]). A connection with a request in progress or
//!   unanswered is never closed for another: only one that is *reusable* may be, the
//!   oldest first: kept alive with nothing received since its last answer (and nothing
//!   waiting in its socket), or holding a request head that stalled for [`STALLED`]
//!   (a flood of unfinished requests only ever displaces itself). It is closed as
//!   hyper's graceful shutdown closes it. When there is none, the new connection is
//!   answered `503` with `Retry-After` before anything is read from it, and closed.
//! - **A bounded number of streams** (event streams, followed logs: responses that stay
//!   open), per client address and in total ([`Streams`]); past either, `503` with
//!   `Retry-After`.
//! - An `accept` that fails for want of descriptors closes an idle connection and tries
//!   again at once, instead of sleeping a second as most servers do.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::response::IntoResponse as _;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt as _;

/// How long a client has to send a request's head (request line and headers).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to send a request's body, once its head has come: a request in
/// progress is never closed for a newer connection, so one that never finishes its body
/// must end by itself.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A request head that has not grown for this long, at a time the server has no room,
/// counts as abandoned: its connection may be closed for a new one.
pub const STALLED: Duration = Duration::from_secs(1);
/// Descriptors kept for everything else the server opens (state, logs, stages' pipes).
const RESERVED_FILES: u64 = 256;
/// What a client told to come back later is told to wait, in seconds.
pub const RETRY_AFTER: &str = "2";

/// How much the listener admits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections: usize,
    /// Connections with no request in progress (new, or kept alive between requests):
    /// past this the oldest is closed, so a flood of them holds little memory.
    pub idle: usize,
    pub streams: usize,
    pub streams_per_client: usize,
}

impl Limits {
    /// For a process that may have `files` descriptors open.
    pub fn for_files(files: u64) -> Limits {
        let connections = files.saturating_sub(RESERVED_FILES).clamp(16, 16_384) as usize;
        let streams = (connections / 2).min(1024);
        Limits {
            connections,
            // Idle keep-alive connections hold a few KiB each: as many as the descriptors
            // allow, up to 4,096 (past it, the oldest reusable one makes room).
            idle: connections.min(4096),
            streams,
            streams_per_client: streams.min(64),
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit; returns the limit
/// it then has.
pub fn raise_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// The streams open now, per client address and in total.
#[derive(Debug)]
pub struct Streams {
    limits: Limits,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One stream's place; given back when the stream's response is dropped.
impl std::fmt::Debug for StreamPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamPermit")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

pub struct StreamPermit {
    streams: Arc<Streams>,
    client: IpAddr,
}

impl Streams {
    pub fn new(limits: Limits) -> Arc<Streams> {
        Arc::new(Streams {
            limits,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a stream to `client`, or why there is none (for [`busy`]).
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Result<StreamPermit, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = open.values().sum();
        let mine = open.get(&client).copied().unwrap_or(0);
        let refusal = if total >= self.limits.streams {
            Some(format!(
                "this server has {total} streams open, its most; retry later"
            ))
        } else if mine >= self.limits.streams_per_client {
            Some(format!(
                "{client} has {mine} streams open, the most one client may; close one or retry later"
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(why);
        }
        *open.entry(client).or_default() += 1;
        Ok(StreamPermit {
            streams: self.clone(),
            client,
        })
    }

    /// Streams open now, in total.
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// `503` with `Retry-After` and a JSON error, as every error of the API is.
pub fn busy(why: &str) -> Response<Body> {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, RETRY_AFTER)],
        axum::Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

/// The address of the client a request came from (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct Client(pub SocketAddr);

/// A response body that keeps something alive as long as it is.
struct Held<T> {
    inner: Body,
    _held: T,
}

impl<T: Unpin + Send + 'static> http_body::Body for Held<T> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request's body that fails once [`BODY_TIMEOUT`] has passed without its end.
struct Deadline {
    inner: hyper::body::Incoming,
    expires: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Deadline {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.expires.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request's body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a connection is doing: requests in progress (from their head to their
/// response's end), and whether bytes of a next request have come.
#[derive(Debug, Default)]
struct Activity {
    busy: AtomicUsize,
    /// Bytes received since the last request was handed over (a head in progress).
    begun: AtomicBool,
    /// When bytes last came, in milliseconds since the listener started.
    last_read: AtomicU64,
}

impl Activity {
    /// Whether the connection may be closed for another at `now` (ms since start): no
    /// request in progress, and none begun or only one stalled for [`STALLED`].
    fn reusable(&self, now: u64) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
            && (!self.begun.load(Ordering::SeqCst) || self.stalled(now))
    }

    /// Whether a request head has begun and not grown for [`STALLED`].
    fn stalled(&self, now: u64) -> bool {
        self.begun.load(Ordering::SeqCst)
            && now.saturating_sub(self.last_read.load(Ordering::SeqCst))
                >= STALLED.as_millis() as u64
    }
}

/// A request in progress on a connection, from its head to its response's end.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Busy {
        activity.busy.fetch_add(1, Ordering::SeqCst);
        activity.begun.store(false, Ordering::SeqCst);
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's socket, noting in its [`Activity`] when bytes come.
struct Watched {
    tcp: tokio::net::TcpStream,
    activity: Arc<Activity>,
    epoch: tokio::time::Instant,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = self.epoch.elapsed().as_millis() as u64;
            self.activity.last_read.store(now, Ordering::SeqCst);
            self.activity.begun.store(true, Ordering::SeqCst);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Whether bytes wait unread in the socket `fd` (a request that came just now).
fn unread(fd: std::os::fd::RawFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut one = [0u8; 1];
    matches!(recv(fd, &mut one, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT), Ok(n) if n > 0)
}

/// The connections open now, oldest first.
struct Connections {
    next: u64,
    open: BTreeMap<u64, Open>,
    epoch: tokio::time::Instant,
}

struct Open {
    activity: Arc<Activity>,
    fd: Option<std::os::fd::RawFd>,
    close: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Connections {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Connections with no request in progress.
    fn idle(&self) -> usize {
        self.open
            .values()
            .filter(|c| c.activity.busy.load(Ordering::SeqCst) == 0)
            .count()
    }

    /// Takes in a new connection within `limits`, closing the oldest reusable one to make
    /// room; its id, or `None` when there is no room.
    fn admit(&mut self, limits: &Limits, open: Open) -> Option<u64> {
        if self.idle() >= limits.idle {
            self.close_oldest_idle();
        }
        if self.open.len() >= limits.connections && !self.close_oldest_idle() {
            return None;
        }
        self.next += 1;
        self.open.insert(self.next, open);
        Some(self.next)
    }

    /// Closes the oldest reusable connection (see the module's doc); false if there is
    /// none.
    fn close_oldest_idle(&mut self) -> bool {
        let now = self.now();
        let idle = self
            .open
            .iter()
            .find(|(_, c)| c.activity.reusable(now) && !c.fd.is_some_and(unread))
            .map(|(id, _)| *id);
        let Some(id) = idle else {
            return false;
        };
        if let Some(mut c) = self.open.remove(&id) {
            if let Some(close) = c.close.take() {
                let _ = close.send(());
            }
        }
        true
    }
}

/// The canned answer to a connection there is no room for, written without reading it.
const NO_ROOM: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Type: application/json\r\nContent-Length: 71\r\nConnection: close\r\n\r\n{\"error\":\"every connection of this server is busy; retry in a moment\"}\n";

/// The service of one connection from `peer`: `app`, each request counted in
/// `activity` until its response's end, its body within [`BODY_TIMEOUT`].
fn service(
    app: Router,
    activity: Arc<Activity>,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<hyper::body::Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let in_progress = Busy::new(&activity);
        req.extensions_mut().insert(Client(peer));
        let app = app.clone();
        async move {
            let req = req.map(|inner| {
                Body::new(Deadline {
                    inner,
                    expires: Box::pin(tokio::time::sleep(BODY_TIMEOUT)),
                })
            });
            let response = app.oneshot(req).await?;
            Ok::<_, Infallible>(response.map(|b| {
                Body::new(Held {
                    inner: b,
                    _held: in_progress,
                })
            }))
        }
    })
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves; then stops
/// accepting, lets every request in progress finish and closes idle connections.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let epoch = tokio::time::Instant::now();
    let conns = Arc::new(Mutex::new(Connections {
        next: 0,
        open: BTreeMap::new(),
        epoch,
    }));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    let out_of_files = matches!(e.raw_os_error(), Some(nix::libc::EMFILE | nix::libc::ENFILE));
                    let closed = out_of_files
                        && conns.lock().unwrap_or_else(|e| e.into_inner()).close_oldest_idle();
                    if !closed {
                        eprintln!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    } else {
                        // Let the closed connection's task drop its socket.
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
            },
        };
        let (close, closed) = tokio::sync::oneshot::channel();
        let activity = Arc::new(Activity::default());
        let admitted = conns.lock().unwrap_or_else(|e| e.into_inner()).admit(
            &limits,
            Open {
                activity: activity.clone(),
                fd: Some(std::os::fd::AsRawFd::as_raw_fd(&stream)),
                close: Some(close),
            },
        );
        let Some(id) = admitted else {
            // Nothing to read, nothing to wait for: one write if the socket takes it.
            let _ = stream.try_write(NO_ROOM);
            continue;
        };
        let service = service(app.clone(), activity.clone(), peer);
        let watched = Watched {
            tcp: stream,
            activity: activity.clone(),
            epoch,
        };
        let conn = http.serve_connection(TokioIo::new(watched), service);
        let (conns, mut stopped) = (conns.clone(), stopped.clone());
        let watching = activity.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                // Displaced by a newer connection, as hyper closes one gracefully: at once
                // when it is between requests, else once the request in hand is answered.
                // An abandoned head is closed at once (hyper would wait for it).
                _ = closed => {
                    if !watching.stalled(epoch.elapsed().as_millis() as u64) {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(HEADER_TIMEOUT, conn).await;
                    }
                }
                _ = async { stopped.wait_for(|s| *s).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .open
                .remove(&id);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    // Requests in progress finish; a stream ends when the server says it is stopping.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .open
        .is_empty()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_leave_room_under_the_file_limit() {
        let l = Limits::for_files(1024);
        assert_eq!(l.connections, 768);
        assert_eq!(l.idle, 768, "300 keep-alive clients displace nobody");
        assert!(l.streams < l.connections && l.streams_per_client <= l.streams);
        assert_eq!(Limits::for_files(10).connections, 16);
    }

    #[test]
    fn the_canned_refusal_is_well_formed() {
        let text = std::str::from_utf8(NO_ROOM).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        assert!(serde_json::from_str::<serde_json::Value>(body).unwrap()["error"].is_string());
        assert!(head.contains(&format!("Retry-After: {RETRY_AFTER}")));
    }

    #[test]
    fn only_a_reusable_connection_is_closed_the_oldest_first() {
        let mut c = Connections {
            next: 0,
            open: BTreeMap::new(),
            epoch: tokio::time::Instant::now() - Duration::from_secs(60),
        };
        let now = c.now();
        let mut closed = Vec::new();
        // Busy; a head begun just now; kept alive; a head stalled for a minute; kept
        // alive.
        for (busy, begun, last_read) in [
            (1, false, 0),
            (0, true, now),
            (0, false, 0),
            (0, true, 0),
            (0, false, 0),
        ] {
            let (close, rx) = tokio::sync::oneshot::channel();
            c.next += 1;
            let activity = Activity {
                busy: AtomicUsize::new(busy),
                begun: AtomicBool::new(begun),
                last_read: AtomicU64::new(last_read),
            };
            c.open.insert(
                c.next,
                Open {
                    activity: Arc::new(activity),
                    fd: None,
                    close: Some(close),
                },
            );
            closed.push(rx);
        }
        assert_eq!(c.idle(), 4);
        assert!(c.close_oldest_idle());
        assert!(
            c.open.contains_key(&2) && !c.open.contains_key(&3),
            "the oldest reusable"
        );
        assert!(closed[2].try_recv().is_ok());
        assert!(
            c.close_oldest_idle() && !c.open.contains_key(&4),
            "the stalled head"
        );
        assert!(c.close_oldest_idle());
        assert!(
            !c.close_oldest_idle(),
            "the busy one and the fresh head stay"
        );
        assert_eq!(c.open.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn streams_are_bounded_per_client_and_in_total() {
        let streams = Streams::new(Limits {
            connections: 10,
            idle: 5,
            streams: 3,
            streams_per_client: 2,
        });
        let (a, b) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let first = streams.admit(a).unwrap();
        let _second = streams.admit(a).unwrap();
        let refused = busy(&streams.admit(a).err().unwrap());
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::RETRY_AFTER], RETRY_AFTER);
        let _third = streams.admit(b).unwrap();
        assert!(streams.admit(b).is_err(), "the total is 3");
        drop(first);
        assert_eq!(streams.open(), 2);
        assert!(streams.admit(b).is_ok());
    }
}
