//! The Grafana dashboards and Prometheus alert rules in `dashboards/` are true to what
//! the server exports: every metric (and every literal label value) that a dashboard
//! expression, a template variable or an alert rule names is in a real scrape after
//! real traffic (a single node's, plus a one-node cluster's for the `im_cluster_*`
//! series); the dashboards are importable (a `${DS_PROMETHEUS}` input, a node
//! variable, units); every alert links to a runbook page that exists; and promtool
//! parses every expression.
//!
//! The PromQL is read roughly: identifiers starting with `im_` or `process_` are metric
//! names, `_bucket`/`_count`/`_sum` are stripped only when the base is a histogram in
//! the scrape. The alert file is read textually (`key: value` lines and block scalars),
//! which is all `dashboards/alerts.yml` uses; promtool checks it as YAML.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use im_client::proto::{Body, ErrorCode};
use serde_json::Value;

use crate::support::*;

/// The repository root (the e2e target belongs to `server/`).
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

// ---------------------------------------------------------------------------------------
// Where the expressions are

/// One PromQL expression and where it came from (for failure messages).
struct Expr {
    origin: String,
    promql: String,
}

/// `dashboards/*.json`, parsed, by file name.
pub(crate) fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("dashboards/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "expected the dashboards in {dir:?}");
    files
        .into_iter()
        .map(|p| {
            let name = format!("dashboards/{}", p.file_name().unwrap().to_string_lossy());
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            (name, v)
        })
        .collect()
}

/// Every panel of a dashboard, rows' nested panels included.
pub(crate) fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out
}

/// Target expressions and query-variable definitions of every dashboard.
fn dashboard_exprs() -> Vec<Expr> {
    let mut out = Vec::new();
    for (file, d) in dashboards() {
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let promql = t["expr"].as_str().unwrap_or_default();
                assert!(
                    !promql.trim().is_empty(),
                    "{file}: panel {:?} has a target without expr",
                    p["title"]
                );
                out.push(Expr {
                    origin: format!(
                        "{file} panel {:?} target {}",
                        p["title"].as_str().unwrap_or("?"),
                        t["refId"].as_str().unwrap_or("?")
                    ),
                    promql: promql.to_owned(),
                });
            }
        }
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] == "query" {
                let q = v["definition"].as_str().expect("query variable definition");
                assert_eq!(
                    v["query"]["query"].as_str(),
                    Some(q),
                    "{file}: variable {} definition and query differ",
                    v["name"]
                );
                out.push(Expr {
                    origin: format!("{file} variable {}", v["name"].as_str().unwrap_or("?")),
                    promql: q.to_owned(),
                });
            }
        }
    }
    out
}

/// One rule of `dashboards/alerts.yml`: its `key: value` fields (expr, labels and
/// annotations flattened; the file uses no key twice within a rule).
#[derive(Debug, Default)]
struct Rule {
    name: String,
    line: usize,
    fields: BTreeMap<String, String>,
}

/// Reads the alert rules textually: `- alert:`/`- record:` start a rule; `key: value`
/// lines (and `|`/`>` block scalars below them) fill it.
fn alert_rules(text: &str) -> Vec<Rule> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rules: Vec<Rule> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let raw = lines[i];
        let indent = raw.len() - raw.trim_start().len();
        let mut line = raw.trim();
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let starts = line.starts_with("- alert:") || line.starts_with("- record:");
        if let Some(rest) = line.strip_prefix("- ") {
            line = rest;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let value = if matches!(value, "|" | "|-" | ">" | ">-") {
            let mut block = Vec::new();
            while i < lines.len() {
                let l = lines[i];
                let ind = l.len() - l.trim_start().len();
                if !l.trim().is_empty() && ind <= indent {
                    break;
                }
                block.push(l.trim());
                i += 1;
            }
            block.join(if value.starts_with('|') { "\n" } else { " " })
        } else {
            unquote(value)
        };
        if starts {
            rules.push(Rule {
                name: value.clone(),
                line: i,
                ..Rule::default()
            });
        }
        if let Some(rule) = rules.last_mut() {
            rule.fields.insert(key.to_owned(), value);
        }
    }
    rules
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    for q in ['"', '\''] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            return v[1..v.len() - 1].to_string();
        }
    }
    v.to_owned()
}

fn alert_exprs(rules: &[Rule]) -> Vec<Expr> {
    rules
        .iter()
        .map(|r| Expr {
            origin: format!("dashboards/alerts.yml rule {} (line {})", r.name, r.line),
            promql: r
                .fields
                .get("expr")
                .unwrap_or_else(|| panic!("rule {} has no expr", r.name))
                .clone(),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Rough PromQL reading

/// A vector selector: a metric name and its label matchers (name, op, value).
#[derive(Debug)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// The selectors of metrics named `im_*`, `process_*` or `up` in an expression.
/// Skips string literals, `$variables`, numbers and durations; a name followed by `(`
/// is a function or a `by`/`without` clause.
fn selectors(promql: &str) -> Vec<Selector> {
    let s: Vec<char> = promql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '$' {
            i += 1;
            while i < s.len() && (ident(s[i]) || s[i] == '{' || s[i] == '}') {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let name: String = s[start..i].iter().collect();
            let mut j = i;
            while j < s.len() && s[j].is_whitespace() {
                j += 1;
            }
            let is_metric = name.starts_with("im_") || name.starts_with("process_") || name == "up";
            if j < s.len() && s[j] == '(' {
                continue; // function, aggregation or grouping clause
            }
            let mut matchers = Vec::new();
            if j < s.len() && s[j] == '{' {
                let (m, end) = parse_matchers(&s, j);
                matchers = m;
                i = end;
            }
            if is_metric {
                out.push(Selector {
                    metric: name,
                    matchers,
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Index just past the string literal starting at `i`.
fn skip_string(s: &[char], i: usize) -> usize {
    let q = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != q {
        if s[j] == '\\' && q != '`' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

/// Parses `{name op "value", ...}` from the `{` at `i`; returns the matchers and the
/// index past the `}`.
fn parse_matchers(s: &[char], i: usize) -> (Vec<(String, String, String)>, usize) {
    let mut out = Vec::new();
    let mut j = i + 1;
    loop {
        while j < s.len() && (s[j].is_whitespace() || s[j] == ',') {
            j += 1;
        }
        if j >= s.len() || s[j] == '}' {
            return (out, j + 1);
        }
        let start = j;
        while j < s.len() && (s[j].is_ascii_alphanumeric() || s[j] == '_') {
            j += 1;
        }
        let name: String = s[start..j].iter().collect();
        while j < s.len() && s[j].is_whitespace() {
            j += 1;
        }
        let op_start = j;
        while j < s.len() && matches!(s[j], '=' | '!' | '~') {
            j += 1;
        }
        let op: String = s[op_start..j].iter().collect();
        while j < s.len() && s[j].is_whitespace() {
            j += 1;
        }
        assert!(
            j < s.len() && matches!(s[j], '"' | '\'' | '`'),
            "cannot read the matchers in {:?}",
            s.iter().collect::<String>()
        );
        let end = skip_string(s, j);
        let value: String = s[j + 1..end - 1].iter().collect();
        out.push((name, op, value.replace("\\\"", "\"")));
        j = end;
    }
}

// ---------------------------------------------------------------------------------------
// The scrape

/// What a scrape exports: each sample name with its label sets, and the histograms.
struct Exported {
    samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    histograms: HashSet<String>,
}

impl Exported {
    fn parse(scrape: &str) -> Exported {
        let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
        let mut histograms = HashSet::new();
        for line in scrape.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split_whitespace();
                if let (Some(name), Some("histogram")) = (it.next(), it.next()) {
                    histograms.insert(name.to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = line[..end].to_string();
            let mut labels = BTreeMap::new();
            if line[end..].starts_with('{') {
                let chars: Vec<char> = line[end..].chars().collect();
                let (m, _) = parse_matchers(&chars, 0);
                for (k, _, v) in m {
                    labels.insert(k, v);
                }
            }
            samples.entry(name).or_default().push(labels);
        }
        Exported {
            samples,
            histograms,
        }
    }

    /// The exported name a metric reference stands for, if any.
    fn resolve(&self, metric: &str) -> Option<String> {
        if self.samples.contains_key(metric) {
            return Some(metric.to_owned());
        }
        for suffix in ["_bucket", "_count", "_sum"] {
            if let Some(base) = metric.strip_suffix(suffix) {
                if self.histograms.contains(base) {
                    return Some(metric.to_owned());
                }
            }
        }
        None
    }

    /// Whether some sample of `metric` carries `label = value`.
    fn has_label_value(&self, metric: &str, label: &str, value: &str) -> bool {
        self.samples
            .get(metric)
            .into_iter()
            .flatten()
            .any(|l| l.get(label).map(String::as_str) == Some(value))
    }
}

/// Literal values a matcher names: `=` and `!=` values, and the parts of a `=~`/`!~`
/// that is a plain alternation (`a|b|c`). None for anything else (variables, regexes).
fn literal_values(op: &str, value: &str) -> Option<Vec<String>> {
    if value.contains('$') || value.is_empty() {
        return None;
    }
    match op {
        "=" | "!=" => Some(vec![value.to_owned()]),
        "=~" | "!~" => {
            let plain = value.split('|').all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || " _-".contains(c))
            });
            plain.then(|| value.split('|').map(str::to_owned).collect())
        }
        _ => None,
    }
}

/// Every reason an expression is not true to the scrape.
fn check_expr(e: &Expr, exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    let sels = selectors(&e.promql);
    for sel in &sels {
        if sel.metric == "up" {
            continue; // written by Prometheus for every target
        }
        let Some(name) = exported.resolve(&sel.metric) else {
            problems.push(format!(
                "{}: metric {} is not exported",
                e.origin, sel.metric
            ));
            continue;
        };
        for (label, op, value) in &sel.matchers {
            // Target labels come from Prometheus, not from the scrape.
            if label == "job" || label == "instance" {
                continue;
            }
            for v in literal_values(op, value).unwrap_or_default() {
                if !exported.has_label_value(&name, label, &v) {
                    problems.push(format!(
                        "{}: no {name} series has {label}=\"{v}\"",
                        e.origin
                    ));
                }
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------
// Tests

/// The scrape of a node with one webhook endpoint, after one event was delivered and
/// the outbox counted.
async fn webhook_scrape() -> String {
    const SECRET: &str = "dashboards-webhook-secret-32-bytes-long";
    let rx = receiver::Receiver::start(SECRET).await;
    let config = format!(
        "[[webhooks.endpoints]]\nname = \"push\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\n\
         events = [\"message.created\"]\n",
        rx.url("/hook")
    );
    let server = TestServer::start_with_config(&config, &[]);
    let mut a = server.raw("dash-w").await;
    a.send(&send_to_user(1, "dash-x", b"hi", "w1"))
        .await
        .unwrap();
    acks(&mut a, 1).await;
    eventually("a webhook delivered and counted", || {
        let s = server.metrics();
        metric_value(&s, "im_webhook_delivered_total", &[("endpoint", "push")]) >= 1.0
            && s.contains("im_webhook_outbox_max")
    })
    .await;
    server.metrics()
}

/// The scrape of region a's node in two regions of one node each, once its applier has
/// reached region b's stream (the `im_region_*` series exist only in multi-region mode;
/// empty when nats-server is missing outside CI).
async fn region_scrape() -> String {
    if !nats::nats_server_available() {
        return String::new();
    }
    let regions =
        regions::Regions::start(&["a", "b"], 1, 1, std::time::Duration::from_millis(1), true).await;
    let node = &regions.region("a").nodes[0];
    eventually("region a's applier reached region b's stream", || {
        metric_value(
            &node.metrics(),
            "im_region_link_up",
            &[("from", "b"), ("to", "a")],
        ) == 1.0
    })
    .await;
    node.metrics()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_dashboards_and_alerts_is_exported() {
    let server = TestServer::start_with(&[("IM_OBS_SAMPLE_INTERVAL_MS", "200")]);
    let mut a = server.raw("dash-a").await;
    let mut b = server.raw("dash-b").await;
    let mut c = server.raw("dash-c").await;

    // A group, then one-to-one and group sends.
    create_group(&mut a, "dash", vec!["dash-b".into(), "dash-c".into()]).await;
    for i in 0..10u64 {
        a.send(&send_to_user(10 + i, "dash-b", b"hi", &format!("u{i}")))
            .await
            .unwrap();
        a.send(&send_to_group(100 + i, "dash", b"all", &format!("g{i}")))
            .await
            .unwrap();
    }
    assert_eq!(acks(&mut a, 20).await.len(), 20);
    for _ in 0..20 {
        next_chat_frame(&mut b).await;
    }
    for _ in 0..10 {
        next_chat_frame(&mut c).await;
    }

    // A bad frame: BAD_FRAME back, counted.
    c.send_bytes(vec![0xff, 0xff, 0xff, 0xff, 0x0f])
        .await
        .unwrap();
    match next_frame(&mut c).await.body {
        Some(Body::Error(e)) => assert_eq!(e.code, ErrorCode::BadFrame as i32),
        other => panic!("expected BAD_FRAME, got {other:?}"),
    }

    eventually("every stage and the bad frame to be counted", || {
        let s = server.metrics();
        metric_value(&s, "im_bad_frames_total", &[("reason", "decode")]) >= 1.0
            && [
                "decode",
                "persist_commit",
                "route",
                "queue_wait",
                "write",
                "end_to_end",
            ]
            .iter()
            .all(|st| metric_value(&s, "im_stage_duration_seconds_count", &[("stage", st)]) > 0.0)
    })
    .await;
    // The cluster metrics exist only in cluster mode: add a one-node cluster's scrape.
    let cluster = cluster::TestCluster::start(1, &[]).await;
    let scrape = format!("{}\n{}", server.metrics(), cluster.nodes[0].metrics());
    cluster.cleanup().await;
    // The webhook metrics exist only with an endpoint: add such a node's scrape.
    let scrape = format!("{scrape}\n{}", webhook_scrape().await);
    // The region metrics exist only in multi-region mode: add such a node's scrape.
    let scrape = format!("{scrape}\n{}", region_scrape().await);
    let exported = Exported::parse(&scrape);

    let rules = alert_rules(&read("dashboards/alerts.yml"));
    let exprs: Vec<Expr> = dashboard_exprs()
        .into_iter()
        .chain(alert_exprs(&rules))
        .collect();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for e in &exprs {
        for s in selectors(&e.promql) {
            used.insert(s.metric);
        }
        problems.extend(check_expr(e, &exported));
    }

    // Custom template variables (the stage list) name real label values.
    for (file, d) in dashboards() {
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] != "custom" {
                continue;
            }
            let label = v["name"].as_str().unwrap();
            for value in v["query"].as_str().unwrap().split(',') {
                let value = value.trim();
                let found = exported
                    .samples
                    .keys()
                    .any(|m| m.starts_with("im_") && exported.has_label_value(m, label, value));
                if !found {
                    problems.push(format!(
                        "{file} variable {label}: no im_ series has {label}=\"{value}\""
                    ));
                }
            }
        }
    }

    assert!(
        problems.is_empty(),
        "dashboards/alerts name what the server does not export:\n  {}\n(exported: {:?})",
        problems.join("\n  "),
        exported.samples.keys().collect::<Vec<_>>()
    );
    // The check saw the core metrics (docs/design.md).
    for name in [
        "im_connections",
        "im_persist_queue_depth",
        "im_slow_consumers",
        "im_capacity_headroom_ratio",
        "im_stage_duration_seconds_bucket",
        "im_bad_frames_total",
        "process_open_fds",
        "im_cluster_link_up",
        "im_cluster_nodes_lost_total",
        "im_region_link_up",
        "im_region_replication_lag_seconds",
        "up",
    ] {
        assert!(used.contains(name), "no dashboard or alert uses {name}");
    }
}

#[test]
fn the_rough_promql_reader_finds_metrics_and_matchers() {
    let sels = selectors(
        r#"histogram_quantile(0.99, sum by (instance, le) (rate(im_stage_duration_seconds_bucket{job=~"$job", stage="persist_commit"}[$__rate_interval]))) > 0.05 and on (instance) im_connections offset 5m or label_values(process_open_fds, instance) + count(up{instance=~"$instance"} == 0) or vector(0) + x{a="im_fake"}"#,
    );
    let names: Vec<&str> = sels.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(
        names,
        [
            "im_stage_duration_seconds_bucket",
            "im_connections",
            "process_open_fds",
            "up"
        ]
    );
    assert_eq!(
        sels[0].matchers,
        [
            ("job".into(), "=~".into(), "$job".into()),
            ("stage".into(), "=".into(), "persist_commit".into())
        ]
    );
    let exported = Exported::parse(
        "# TYPE h histogram\nh_bucket{stage=\"a b\",le=\"+Inf\"} 1\nh_count{stage=\"a b\"} 1\nim_g 2\n",
    );
    assert_eq!(exported.resolve("h_count").as_deref(), Some("h_count"));
    assert_eq!(exported.resolve("im_g_count"), None);
    assert!(exported.has_label_value("h_bucket", "stage", "a b"));
    assert_eq!(
        literal_values("!~", "persist_commit|end_to_end"),
        Some(vec!["persist_commit".into(), "end_to_end".into()])
    );
    assert_eq!(literal_values("=~", "5.."), None);
}

#[test]
fn dashboards_are_importable_into_grafana() {
    let mut uids = HashSet::new();
    for (file, d) in dashboards() {
        let inputs = d["__inputs"].as_array().expect("__inputs");
        assert!(
            inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS"
                && i["type"] == "datasource"
                && i["pluginId"] == "prometheus"),
            "{file}: no DS_PROMETHEUS data source input"
        );
        assert!(
            d["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{file}: uid"
        );
        assert!(uids.insert(d["uid"].to_string()), "{file}: duplicate uid");
        assert!(
            d["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{file}: title"
        );
        assert!(
            d["schemaVersion"].as_u64().unwrap_or(0) >= 36,
            "{file}: schemaVersion below Grafana 9/10"
        );
        assert!(d["id"].is_null(), "{file}: id must be null for import");

        // Every Prometheus data source reference is the input.
        fn datasources<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
            match v {
                Value::Object(m) => {
                    for (k, x) in m {
                        if k == "datasource" {
                            out.push(x);
                        }
                        datasources(x, out);
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| datasources(x, out)),
                _ => {}
            }
        }
        let mut ds = Vec::new();
        datasources(&d, &mut ds);
        for x in ds {
            assert!(x.is_object(), "{file}: data source given by name: {x}");
            if x["type"] == "prometheus" {
                assert_eq!(x["uid"], "${DS_PROMETHEUS}", "{file}: data source {x}");
            }
        }

        // The node variable, from label_values.
        let vars = d["templating"]["list"].as_array().expect("templating");
        let node = vars
            .iter()
            .find(|v| v["name"] == "instance")
            .unwrap_or_else(|| panic!("{file}: no instance variable"));
        assert_eq!(node["type"], "query", "{file}");
        assert!(
            node["definition"]
                .as_str()
                .is_some_and(|q| q.starts_with("label_values(") && q.ends_with(", instance)")),
            "{file}: instance variable {node}"
        );

        let mut ids = HashSet::new();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(!title.is_empty(), "{file}: a panel without a title");
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{file}: duplicate id {title}"
            );
            let g = &p["gridPos"];
            let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
            assert!(
                x + w <= 24 && g["h"].as_u64().unwrap() > 0,
                "{file}: {title} gridPos {g}"
            );
            let kind = p["type"].as_str().unwrap();
            if kind == "row" {
                continue;
            }
            let unit = if kind == "heatmap" {
                &p["options"]["yAxis"]["unit"]
            } else {
                &p["fieldConfig"]["defaults"]["unit"]
            };
            assert!(
                unit.as_str().is_some_and(|u| !u.is_empty()),
                "{file}: {title} has no unit"
            );
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{file}: {title} has no query");
            // Every series the panel reads is filtered by the node variable.
            for t in targets {
                for s in selectors(t["expr"].as_str().unwrap()) {
                    assert!(
                        s.matchers
                            .iter()
                            .any(|(l, op, v)| l == "instance" && op == "=~" && v == "$instance"),
                        "{file}: {title}: {} is not filtered by instance=~\"$instance\"",
                        s.metric
                    );
                }
            }
        }
    }
}

/// How every alert's `runbook_url` begins: the external label that carries the base URL
/// of the runbooks (dashboards/README.md).
pub(crate) const RUNBOOK_BASE: &str = "{{ $externalLabels.runbook_base }}";

#[test]
fn every_alert_has_a_runbook_summary_and_description() {
    let rules = alert_rules(&read("dashboards/alerts.yml"));
    assert!(rules.len() >= 6, "too few rules: {}", rules.len());
    let mut names = HashSet::new();
    let must = [
        "ImNodeDown",
        "ImPersistBacklogGrowing",
        "ImSlowConsumersRising",
        "ImCapacityHeadroomLow",
        "ImPersistCommitSlow",
        "ImEndToEndLatencyHigh",
        "ImBadFramesSpike",
        "ImClusterLinkDown",
        "ImClusterNodeLost",
        "ImRegionLinkDown",
        "ImRegionLagHigh",
        "ImRegionConfigMismatch",
    ];
    for r in &rules {
        assert!(names.insert(r.name.clone()), "duplicate alert {}", r.name);
        for key in ["expr", "severity", "summary", "description", "runbook_url"] {
            assert!(
                r.fields.get(key).is_some_and(|v| !v.trim().is_empty()),
                "alert {} has no {key}",
                r.name
            );
        }
        // An absolute link: the one documented base (the `runbook_base` external label)
        // and a page of runbooks/.
        let url = &r.fields["runbook_url"];
        let file = url
            .strip_prefix(RUNBOOK_BASE)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or_else(|| {
                panic!(
                    "alert {}: runbook_url {url} does not start with {RUNBOOK_BASE}/",
                    r.name
                )
            });
        assert!(
            file.ends_with(".md") && !file.contains('/') && !file.contains(".."),
            "alert {}: runbook_url {url} does not name a runbooks/ page",
            r.name
        );
        let page = repo().join("runbooks").join(file);
        assert!(page.is_file(), "alert {}: {url} does not exist", r.name);
        let text = std::fs::read_to_string(&page).unwrap();
        assert!(
            text.contains(&r.name),
            "alert {}: {url} does not mention the alert",
            r.name
        );
    }
    for m in must {
        assert!(names.contains(m), "no alert {m}");
    }

    // The base is documented where the operator sets up Prometheus.
    for doc in ["dashboards/README.md", "docs/operations.md"] {
        assert!(
            read(doc).contains("runbook_base"),
            "{doc} does not document the runbook_base external label"
        );
    }

    // The runbook index links every page.
    let index = read("runbooks/README.md");
    for e in std::fs::read_dir(repo().join("runbooks")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") && name != "README.md" {
            assert!(
                index.contains(&format!("({name})")),
                "runbooks/README.md does not link {name}"
            );
        }
    }
}

#[test]
fn promtool_parses_every_rule_and_dashboard_expression() {
    if !promtool_available() {
        return;
    }
    let root = repo();
    promtool(&["check", "rules", "dashboards/alerts.yml"], &root);
    promtool(&["test", "rules", "dashboards/alerts.test.yml"], &root);

    // Dashboard queries as recording rules, Grafana's variables replaced; the comment
    // above each names its panel.
    let mut yaml = String::from("groups:\n  - name: dashboards\n    rules:\n");
    for (i, e) in dashboard_exprs().into_iter().enumerate() {
        let mut q = e
            .promql
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$__range", "1h");
        for var in ["$job", "$instance", "$stage"] {
            q = q.replace(var, "x");
        }
        assert!(!q.contains('$'), "{}: unknown variable in {q}", e.origin);
        // A variable's label_values(SELECTOR, label) is Grafana's; promtool reads SELECTOR.
        if let Some(inner) = q.strip_prefix("label_values(") {
            q = inner[..inner.rfind(',').expect("label_values(metric, label)")].to_string();
        }
        yaml.push_str(&format!(
            "      # {}\n      - record: dashboard:expr{i}\n        expr: {}\n",
            e.origin.replace('\n', " "),
            serde_json::to_string(&q).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboards.yml"), yaml).unwrap();
    promtool(&["check", "rules", "dashboards.yml"], dir.path());
}

/// Whether promtool runs; false (skip) when it is missing outside CI.
fn promtool_available() -> bool {
    tool_available("promtool", &["--version"], "apt-get install prometheus")
}

fn promtool(args: &[&str], dir: &Path) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
}
