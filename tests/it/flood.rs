//! `drivetrain serve` under a flood of connections nobody uses and of event streams, with
//! the common limit of 1,024 open files (set on the server's process, soft and hard, so
//! it cannot raise it): it keeps answering, refuses the streams past its bound with
//! `503` and `Retry-After`, and gives the memory back once they close. The real binary
//! on loopback; the flood stops by itself when the test ends. The figures (latencies,
//! RSS) come from `bench/flood.py`; the bounds here are a hundred times looser and
//! only tell a server that answers from one that does not.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common;
use common::http::{request, Server, TOKEN};
use common::Home;

const IDLE: usize = 1_100;
const STREAMS: usize = 2_000;

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Opens to this test as many files as the flood needs (its soft limit up to its hard).
fn room_for_the_flood() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let need = (IDLE + STREAMS + 256) as u64;
    assert!(
        hard >= need,
        "this test opens {need} sockets; the hard limit on open files here is {hard}"
    );
    setrlimit(Resource::RLIMIT_NOFILE, need, hard).unwrap();
}

/// `serve` with at most 1,024 open files, soft and hard (`ulimit -n` without `-S` or
/// `-H` sets both).
fn start_limited(home: &Home) -> Server {
    let wrapper = ["sh", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\""];
    common::http::start_wrapped(home, &wrapper, &["--token", TOKEN])
}

/// How long `/healthz` takes to answer 200.
fn healthz(s: &Server) -> Duration {
    let started = Instant::now();
    assert_eq!(request(s, "GET", "/healthz", None, None).0, 200);
    started.elapsed()
}

/// The first bytes of an answer on `c`, waiting at most `within`.
fn head(c: &mut TcpStream, within: Duration) -> String {
    c.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn serve_answers_through_a_flood_of_idle_connections_and_streams() {
    room_for_the_flood();
    let home = Home::new("flood");
    common::http::serve_hello(&home);
    let s = start_limited(&home);
    let pid = s.child.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")),
        "{limits}"
    );
    // Warm: the first of each kind of request faults in code and fills caches.
    healthz(&s);
    assert_eq!(request(&s, "GET", "/api/v1/runs", Some(TOKEN), None).0, 200);
    assert_eq!(request(&s, "GET", "/metrics", Some(TOKEN), None).0, 200);
    let mut first = TcpStream::connect(&s.addr).unwrap();
    write!(
        first,
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        s.addr
    )
    .unwrap();
    assert!(head(&mut first, Duration::from_secs(5)).starts_with("HTTP/1.1 200"));
    drop(first);
    std::thread::sleep(Duration::from_secs(1));
    let before = rss_kib(pid);

    // Requests begun and never finished: more than the server may have files.
    let mut held = Vec::new();
    for _ in 0..IDLE {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        held.push(c);
    }
    // Stalled: a head that has not grown for a second is abandoned, and only such a
    // connection (or one kept alive with nothing asked) makes room for a new one.
    std::thread::sleep(Duration::from_millis(1500));
    let during_idle = healthz(&s);

    // Streams of the run list, each a request of its own, all from this one client.
    let ask = format!(
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        s.addr
    );
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(ask.as_bytes()).unwrap();
        streams.push(c);
    }
    let during_streams = healthz(&s);
    let peak = rss_kib(pid);
    let api = Instant::now();
    assert_eq!(request(&s, "GET", "/api/v1/runs", Some(TOKEN), None).0, 200);
    let api = api.elapsed();

    // The newest streams' answers: served, or refused with a time to come back.
    let (mut open, mut refused) = (0, 0);
    for c in streams.iter_mut().rev().take(200) {
        let h = head(c, Duration::from_secs(5));
        if h.starts_with("HTTP/1.1 200") {
            assert!(h.contains("text/event-stream"), "{h}");
            open += 1;
        } else if h.starts_with("HTTP/1.1 503") {
            assert!(h.to_ascii_lowercase().contains("retry-after: "), "{h}");
            refused += 1;
        }
    }
    assert!(refused > 0, "2,000 streams from one client, none refused");
    // Those still open, and the metric that counts them.
    let (_, metrics) = request(&s, "GET", "/metrics", Some(TOKEN), None);
    let counted: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drivetrain_http_streams "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(counted > 0 && counted <= 1024, "{counted} streams open");
    eprintln!(
        "healthz: {during_idle:?} under {IDLE} idle connections, {during_streams:?} with \
         {STREAMS} streams asked for ({counted} open; of the last 200, {open} served, \
         {refused} refused); GET /api/v1/runs {api:?}"
    );
    let bound = Duration::from_secs(10);
    assert!(during_idle < bound && during_streams < bound && api < bound);

    // An unfinished request does not hold its connection past the header timeout.
    let mut slow = TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    drop(held);
    drop(streams);
    let closed = Instant::now();
    let mut rest = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        closed.elapsed() < Duration::from_secs(25),
        "an unfinished request held its connection {:?}",
        closed.elapsed()
    );

    // The memory the flood took comes back once it is over.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let now = rss_kib(pid);
        if now <= before + before / 5 || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "RSS {before} KiB before the flood, {peak} KiB at its height, {after} KiB after it closed"
    );
    assert!(
        after <= before + before / 5,
        "RSS {before} KiB before the flood, {after} KiB after it closed"
    );
    healthz(&s);
}

/// `serve` lifts its soft limit on open files to the hard one at start.
#[test]
fn serve_raises_its_file_limit_to_the_hard_one() {
    let home = Home::new("flood-limit");
    common::http::serve_hello(&home);
    let wrapper = [
        "sh",
        "-c",
        "ulimit -Sn 1024 && ulimit -Hn 4096 && exec \"$0\" \"$@\"",
    ];
    let s = common::http::start_wrapped(&home, &wrapper, &[]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.child.id())).unwrap();
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        files.split_whitespace().skip(3).take(2).collect::<Vec<_>>(),
        ["4096", "4096"],
        "{files}"
    );
}

/// A request whose body never finishes is answered (a body that could not be read) once
/// its time is up, and its connection is free again: a request in progress is never
/// closed for a newer connection, so this is what ends one.
#[test]
fn a_body_that_never_finishes_is_answered_in_time() {
    let home = Home::new("flood-body");
    common::http::serve_hello(&home);
    let s = common::http::start(&home, &["--token", TOKEN]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /api/v1/runs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"pipeline\": ",
        s.addr
    )
    .unwrap();
    let sent = Instant::now();
    let answer = head(&mut c, Duration::from_secs(60));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        sent.elapsed() > Duration::from_secs(20) && sent.elapsed() < Duration::from_secs(50),
        "{:?}",
        sent.elapsed()
    );
    healthz(&s);
}

/// One keep-alive client: `GET /healthz` again and again on one connection for `span`,
/// reconnecting when the server closed it. Answers had, and requests sent that got no
/// answer (the connection closed under them).
fn keep_alive_client(addr: &str, span: Duration) -> (usize, usize) {
    let (mut answered, mut lost) = (0, 0);
    let deadline = Instant::now() + span;
    let mut conn: Option<std::io::BufReader<TcpStream>> = None;
    while Instant::now() < deadline {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => conn.insert(std::io::BufReader::new(TcpStream::connect(addr).unwrap())),
        };
        c.get_ref()
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let sent = c
            .get_mut()
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        match sent.ok().and_then(|_| read_answer(c)) {
            Some(200) => answered += 1,
            Some(503) => {
                // Refused before it was read: nothing lost, come back.
                conn = None;
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => {
                lost += 1;
                conn = None;
            }
        }
    }
    (answered, lost)
}

/// Reads one answer's head and body: its status.
fn read_answer(c: &mut std::io::BufReader<TcpStream>) -> Option<u16> {
    use std::io::BufRead as _;
    let mut line = String::new();
    c.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = 0usize;
    loop {
        line.clear();
        c.read_line(&mut line).ok().filter(|n| *n > 0)?;
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    c.read_exact(&mut body).ok()?;
    Some(status)
}

/// 300 clients on keep-alive connections, more than the 256 idle connections `serve`
/// once kept with 1,024 files, ask and ask again: every request is answered (issue 46:
/// the listener closed the oldest idle connection for each new one, sometimes after its
/// request was read, and 2 to 12.6 % of requests got no answer).
#[test]
fn keep_alive_clients_past_the_idle_bound_lose_no_answer() {
    room_for_the_flood();
    let home = Home::new("flood-keepalive");
    common::http::serve_hello(&home);
    let s = start_limited(&home);
    let clients: Vec<_> = (0..300)
        .map(|_| {
            let addr = s.addr.clone();
            std::thread::spawn(move || keep_alive_client(&addr, Duration::from_secs(5)))
        })
        .collect();
    let (mut answered, mut lost) = (0, 0);
    for c in clients {
        let (a, l) = c.join().unwrap();
        answered += a;
        lost += l;
    }
    eprintln!("300 keep-alive clients for 5 s: {answered} answered, {lost} lost");
    assert!(answered > 300, "{answered} answered");
    assert_eq!(lost, 0, "{lost} requests got no answer ({answered} did)");
}
