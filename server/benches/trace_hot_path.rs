//! What message tracing costs per message on the hot path, in-process (criterion): the
//! decision `Tracer::begin` makes for every Send and, when it traces, the recording the
//! pipeline does (decode, validate, relation, persist_wait, persist_commit, route, one
//! recipient's queue_wait and write, and filing the part in the bounded store). Four
//! cases: tracing off, a 1/1000 sample, a log filter on another user, and the sender
//! filtered (every message traced).
//! Run: `cargo bench -p im-server --bench trace_hot_path`.

#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use im_server::obs::logfilter::{parse_uid_level, LevelSpec, LogFilters};
use im_server::obs::trace::Tracer;
use im_server::obs::Stage;

/// Distinct msg_ids, more than the store holds, so filing also evicts.
const IDS: usize = 4096;

/// One message through the tracing points, as the pipeline, writer, router and write
/// loop would touch them.
fn one_message(tracer: &Arc<Tracer>, sender: &str, msg_id: &str, started: Instant) {
    let Some(mut t) = tracer.begin(black_box(sender), started) else {
        return;
    };
    let now = Instant::now();
    t.stage(Stage::Decode, started, now);
    t.stage(Stage::Validate, now, now);
    t.stage(Stage::Relation, now, now);
    t.set_message(msg_id, "u:alice:bob");
    t.stage(Stage::PersistWait, now, now);
    t.stage(Stage::PersistCommit, now, now);
    t.set_committed(msg_id, 1);
    let active = tracer.activate(*t);
    let copy = active.copy_for("bob");
    active.stage(Stage::Route, now, now);
    drop(active);
    if let Some(c) = copy {
        c.stage(Stage::QueueWait, now, now);
        c.stage(Stage::Write, now, now);
    }
}

fn bench(c: &mut Criterion) {
    let filters = LogFilters::new(LevelSpec::parse("info").expect("level"), true, 1000);
    filters.install();
    let debug = parse_uid_level("debug").expect("level");
    let tracer = Arc::new(Tracer::default());
    let ids: Vec<String> = (0..IDS).map(|i| format!("{i:032x}")).collect();
    let started = Instant::now();
    let mut g = c.benchmark_group("trace_hot_path");
    let run = |name: &str, g: &mut BenchmarkGroup<'_, WallTime>| {
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % IDS;
                one_message(&tracer, "alice", &ids[i], started);
            })
        });
    };

    tracer.configure("n0", 0.0, 64, 1024);
    run("off", &mut g);
    tracer.configure("n0", 0.001, 64, 1024);
    run("sample_1_in_1000", &mut g);
    tracer.configure("n0", 0.0, 64, 1024);
    filters
        .set("carol", debug, Duration::from_secs(3600))
        .expect("filter");
    run("filter_on_another_user", &mut g);
    filters
        .set("alice", debug, Duration::from_secs(3600))
        .expect("filter");
    run("sender_filtered", &mut g);
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
