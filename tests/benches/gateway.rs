//! The gateway's cost on the Messages API path (release `ctxd gateway` in front of the
//! local upstream of `ctxd_e2e::gateway`, plain HTTP on loopback):
//!
//! - time to first byte of a streamed answer through the gateway against straight to
//!   the upstream, medians over alternating requests, with 1 and 32 streams at once;
//! - a 20 MB request and a 100 MB streamed answer: ctxd's peak resident memory before
//!   and after (`VmHWM`), which the bodies must not raise by more than a few buffers;
//! - `count_tokens` at 1,000 requests a second for 10 s: the rate held and the errors.
//!
//! `cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench gateway`
//! (`-- --quick`: fewer rounds, 3 s of `count_tokens`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use ctxd_e2e::gateway::{self, Gateway};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Milliseconds from sending a `fast` stream request to its first body byte.
async fn first_byte(client: &reqwest::Client, url: &str) -> f64 {
    let started = Instant::now();
    let mut answer = client.post(url).header("x-stub", "fast").body(r#"{"stream":true}"#).send().await.unwrap();
    let first = answer.chunk().await.unwrap();
    assert!(first.is_some_and(|c| !c.is_empty()));
    let at = started.elapsed().as_secs_f64() * 1000.0;
    while answer.chunk().await.unwrap().is_some() {}
    at
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &[], &[]).unwrap();
    let pid = gw.child.id();
    let client = gateway::client();
    let direct = format!("{}/v1/messages", upstream.url());
    let through = gw.url("/v1/messages");
    println!("gateway bench: ctxd {}", ctxd_e2e::ctxd_bin().display());

    // Time to first byte, alternating direct and through the gateway.
    let rounds = if quick { 40 } else { 200 };
    for streams in [1usize, 32] {
        let (mut straight, mut via) = (Vec::new(), Vec::new());
        rt.block_on(async {
            // Warm both paths' connections.
            for _ in 0..streams {
                first_byte(&client, &direct).await;
                first_byte(&client, &through).await;
            }
            for _ in 0..rounds / streams.min(8) {
                for (url, into) in [(&direct, &mut straight), (&through, &mut via)] {
                    let all = futures::future::join_all((0..streams).map(|_| first_byte(&client, url))).await;
                    into.extend(all);
                }
            }
        });
        let (d, g) = (median(straight), median(via));
        println!(
            "time to first byte, {streams} stream(s): direct {d:.3} ms, through the gateway {g:.3} ms, added {:.3} ms (median of {} each)",
            g - d,
            rounds / streams.min(8) * streams
        );
    }

    // Large bodies and ctxd's peak memory.
    let (_, before) = ctxd_e2e::memory_kb(pid).unwrap();
    rt.block_on(async {
        let body = vec![b'x'; 20_000_000];
        let answer = client.post(&through).header("x-stub", "count").body(body).send().await.unwrap();
        assert_eq!(answer.status(), 200);
    });
    let (_, after_request) = ctxd_e2e::memory_kb(pid).unwrap();
    let started = Instant::now();
    let streamed = rt.block_on(async {
        let mut answer = client.post(&through).header("x-stub", "big:100").body("{}").send().await.unwrap();
        let mut n = 0usize;
        while let Some(chunk) = answer.chunk().await.unwrap() {
            n += chunk.len();
        }
        n
    });
    let took = started.elapsed().as_secs_f64();
    let (_, after_answer) = ctxd_e2e::memory_kb(pid).unwrap();
    println!(
        "peak RSS of ctxd: {:.1} MB after warm-up, {:.1} MB after a 20 MB request (+{:.1}), {:.1} MB after a {:.0} MB streamed answer (+{:.1}; {:.0} MB/s)",
        before as f64 / 1024.0,
        after_request as f64 / 1024.0,
        (after_request - before) as f64 / 1024.0,
        after_answer as f64 / 1024.0,
        streamed as f64 / 1e6,
        (after_answer - after_request) as f64 / 1024.0,
        streamed as f64 / 1e6 / took
    );

    // count_tokens at a steady 1,000/s.
    let seconds = if quick { 3 } else { 10 };
    let count_url = gw.url("/v1/messages/count_tokens");
    let (done, errors, took) = rt.block_on(async {
        let started = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval(Duration::from_millis(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = Vec::new();
        for _ in 0..seconds * 1000 {
            ticks.tick().await;
            let client = client.clone();
            let url = count_url.clone();
            tasks.push(tokio::spawn(async move {
                match client.post(&url).header("x-stub", "count").body(r#"{"messages":[]}"#).send().await {
                    Ok(answer) => answer.status().is_success() && answer.bytes().await.is_ok(),
                    Err(_) => false,
                }
            }));
        }
        let results = futures::future::join_all(tasks).await;
        let took = started.elapsed().as_secs_f64();
        let ok = results.iter().filter(|r| matches!(r, Ok(true))).count();
        (ok, results.len() - ok, took)
    });
    println!(
        "count_tokens: {done} answered, {errors} errors in {took:.2} s ({:.0}/s asked 1,000/s)",
        done as f64 / took
    );
}
