//! `rota worker --metrics-addr`: the worker's counters in Prometheus text format at
//! `GET /metrics`, served by a deliberately tiny HTTP/1.1 responder (one request per
//! connection, bounded reads) so that the CLI needs no HTTP server stack.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rpc::lease::WorkerStats;
use rpc::worker_client::WorkerClient;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;

/// Longest request head read; a longer one is answered 431.
const REQUEST_HEAD_MAX: usize = 8 * 1024;

/// How long a connection may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Most scrapes answered at once; more wait for a slot.
const CONNECTIONS_MAX: usize = 32;

/// A group's name, its counters and its concurrency.
pub type GroupStats = (String, Arc<WorkerStats>, usize);

/// Answers scrapes on `listener` until the process ends; `client` is the worker's
/// client, whose retries count the calls that failed.
pub async fn serve(listener: TcpListener, groups: Vec<GroupStats>, client: Arc<WorkerClient>) {
    let groups = Arc::new(groups);
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let groups = Arc::clone(&groups);
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            let page = answer(stream, &groups, &client);
            let _ = tokio::time::timeout(READ_TIMEOUT, page).await;
            drop(slot);
        });
    }
}

/// Reads one request head and answers it.
async fn answer(
    mut stream: TcpStream,
    groups: &[GroupStats],
    client: &WorkerClient,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > REQUEST_HEAD_MAX {
            return respond(&mut stream, "431 Request Header Fields Too Large", "").await;
        }
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buffer[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let page = render(groups, client.retries());
            respond(&mut stream, "200 OK", &page).await
        }
        ("GET", _) => respond(&mut stream, "404 Not Found", "try GET /metrics\n").await,
        _ => respond(&mut stream, "405 Method Not Allowed", "use GET\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// A label value with `\`, `"` and newlines escaped, as the text format asks.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics page; `node_retries` counts the client's calls that failed and were tried
/// again (on the same node or another): the first sign of a node out of reach, long
/// before a claim gives up and counts as a claim error.
pub fn render(groups: &[GroupStats], node_retries: u64) -> String {
    type Read = fn(&WorkerStats, usize) -> f64;
    let metrics: [(&str, &str, &str, Read); 10] = [
        (
            "rota_worker_tasks_claimed_total",
            "counter",
            "Tasks claimed.",
            |s, _| WorkerStats::get(&s.claimed) as f64,
        ),
        (
            "rota_worker_tasks_finished_total",
            "counter",
            "Tasks whose command exited 0 and whose finish was acknowledged.",
            |s, _| WorkerStats::get(&s.finished) as f64,
        ),
        (
            "rota_worker_tasks_failed_total",
            "counter",
            "Tasks failed: the command exited non-zero or could not start.",
            |s, _| WorkerStats::get(&s.failed) as f64,
        ),
        (
            "rota_worker_tasks_released_total",
            "counter",
            "Tasks given back, to run elsewhere at once, because the worker stopped while their command ran past the grace.",
            |s, _| WorkerStats::get(&s.released) as f64,
        ),
        (
            "rota_worker_leases_lost_total",
            "counter",
            "Tasks whose lease was lost (cancelled, refused renewal, expiry) while their command ran.",
            |s, _| WorkerStats::get(&s.lost) as f64,
        ),
        (
            "rota_worker_claims_sent_total",
            "counter",
            "Claim requests sent; a task that a finish claimed in the same write needs none.",
            |s, _| WorkerStats::get(&s.claims_sent) as f64,
        ),
        (
            "rota_worker_claim_errors_total",
            "counter",
            "Claims that got no answer or a refusal.",
            |s, _| WorkerStats::get(&s.claim_errors) as f64,
        ),
        (
            "rota_worker_command_seconds_total",
            "counter",
            "Time commands ran, in seconds.",
            |s, _| WorkerStats::get(&s.work_ms) as f64 / 1000.0,
        ),
        (
            "rota_worker_running",
            "gauge",
            "Commands running now.",
            |s, _| WorkerStats::get(&s.running) as f64,
        ),
        (
            "rota_worker_concurrency",
            "gauge",
            "Most commands run at once.",
            |_, c| c as f64,
        ),
    ];
    let mut page = String::new();
    for (name, kind, help, read) in metrics {
        let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (group, stats, concurrency) in groups {
            let _ = writeln!(
                page,
                "{name}{{group=\"{}\"}} {}",
                label(group),
                read(stats, *concurrency)
            );
        }
    }
    let name = "rota_worker_node_retries_total";
    let _ = writeln!(
        page,
        "# HELP {name} Calls to a node that failed (no answer, a 5xx, a 429) and were tried again, on that node or another.\n# TYPE {name} counter\n{name} {node_retries}"
    );
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_every_metric_for_every_group() {
        let stats = Arc::new(WorkerStats::default());
        stats.claimed.store(5, std::sync::atomic::Ordering::Relaxed);
        stats
            .work_ms
            .store(2_500, std::sync::atomic::Ordering::Relaxed);
        let page = render(
            &[
                ("a\"b".to_string(), Arc::clone(&stats), 4),
                ("c".to_string(), Arc::default(), 1),
            ],
            3,
        );
        assert!(
            page.contains("rota_worker_tasks_claimed_total{group=\"a\\\"b\"} 5\n"),
            "{page}"
        );
        assert!(page.contains("rota_worker_command_seconds_total{group=\"a\\\"b\"} 2.5\n"));
        assert!(page.contains("rota_worker_concurrency{group=\"c\"} 1\n"));
        assert!(page.contains("# TYPE rota_worker_running gauge\n"));
        assert!(page.contains("rota_worker_tasks_released_total{group=\"c\"} 0\n"));
        assert!(page.contains(
            "# TYPE rota_worker_node_retries_total counter\nrota_worker_node_retries_total 3\n"
        ));
        assert_eq!(page.matches("# HELP").count(), 11);
    }
}
