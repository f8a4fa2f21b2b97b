//! Host tests over the recording fake backend: the session's life and the
//! proxy's routing, end to end through a session task.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::EXECUTOR_KEY;
use super::{HostConfig, ResolveFn, Services, SessionHandle, spawn_session};
use box_jsonrpc::{self as jsonrpc, ReplyStream};
use box_policy::plan::{HostFacts, Plan, PlanError, Role, UserIds};
use box_policy::profile::{Catalog, Profile};
use box_testkit::fake::{FakeBackend, FakeOptions};

const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn facts() -> HostFacts {
    HostFacts {
        cwd: std::env::temp_dir(),
        caller: UserIds {
            uid: 1000,
            gid: 1000,
        },
        workspace_owner: None,
    }
}

/// A host's settings and services, as its sessions get them.
#[derive(Clone)]
pub(crate) struct TestHost {
    pub(crate) config: Arc<HostConfig>,
    pub(crate) services: Arc<Services>,
}

impl TestHost {
    fn new(config: HostConfig, services: Services) -> Self {
        Self {
            config: Arc::new(config),
            services: Arc::new(services),
        }
    }
}

/// box's default settings, with the test facts.
fn settings() -> HostConfig {
    HostConfig::new(Catalog::new(Vec::new()), facts())
}

/// Services around `fake`.
fn services(fake: &FakeBackend) -> Services {
    Services::new(Arc::new(fake.clone()))
}

pub(crate) fn config_with(fake: &FakeBackend, resolve: ResolveFn) -> TestHost {
    let mut config = settings();
    config.resolve = resolve;
    config.instance = "test-instance".to_owned();
    TestHost::new(config, services(fake))
}

fn config(fake: &FakeBackend) -> TestHost {
    config_with(fake, box_policy::plan::resolve)
}

/// The plan's workspace unit, changed by `change`.
fn one_unit(
    profile: &Profile,
    tighten: &Value,
    host: &HostFacts,
    change: fn(&mut box_policy::plan::UnitSpec),
) -> Result<Plan, PlanError> {
    let mut plan = box_policy::plan::resolve(profile, tighten, host)?;
    plan.units.truncate(1);
    change(&mut plan.units[0]);
    Ok(plan)
}

fn short_deadline(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.limits.call_timeout = Duration::from_millis(200)
    })
}

fn short_idle(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.limits.idle = Duration::from_millis(200)
    })
}

/// A workspace unit and two server units, `u2` and `u3`.
pub(crate) fn three_units(
    profile: &Profile,
    tighten: &Value,
    host: &HostFacts,
) -> Result<Plan, PlanError> {
    let mut plan = box_policy::plan::resolve(profile, tighten, host)?;
    plan.units.truncate(1);
    for name in ["u2", "u3"] {
        let mut server = plan.units[0].clone();
        server.name = name.to_owned();
        server.role = Role::Server;
        server.command = vec![format!("{name}-server"), "--stdio".to_owned()];
        server.description = format!("the {name} server");
        plan.units.push(server);
    }
    Ok(plan)
}

struct Client {
    session: SessionHandle,
    general: mpsc::Receiver<Value>,
    _shutdown: CancellationToken,
}

fn connect(host: TestHost) -> Client {
    let shutdown = CancellationToken::new();
    let (general_tx, general) = mpsc::channel(64);
    let session = spawn_session(
        host.config,
        host.services,
        "s-test".to_owned(),
        general_tx,
        &shutdown,
    );
    Client {
        session,
        general,
        _shutdown: shutdown,
    }
}

fn initialize_params(ask: Value) -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"elicitation": {}, "experimental": {EXECUTOR_KEY: ask}},
        "clientInfo": {"name": "test", "version": "1"}
    })
}

/// Wait for a request's events and answer.
async fn collect(mut stream: ReplyStream) -> (Vec<Value>, Value) {
    let response = tokio::time::timeout(WAIT, &mut stream.response)
        .await
        .expect("an answer in time")
        .expect("an answer, not a dropped request");
    let mut events = Vec::new();
    while let Ok(event) = stream.events.try_recv() {
        events.push(event);
    }
    (events, response)
}

impl Client {
    async fn send(&self, id: Value, method: &str, params: Value) -> ReplyStream {
        self.session
            .request(jsonrpc::request(id, method, params))
            .await
            .unwrap()
    }

    async fn call(&self, id: Value, method: &str, params: Value) -> (Vec<Value>, Value) {
        collect(self.send(id, method, params).await).await
    }

    async fn initialize(&self, ask: Value) -> Value {
        let (_, response) = self
            .call(json!(0), "initialize", initialize_params(ask))
            .await;
        response
    }

    async fn tool(&self, id: Value, name: &str, arguments: Value) -> ReplyStream {
        self.send(
            id,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        )
        .await
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn initialize_answers_with_the_envelopes_and_passes_max_read_bytes() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let response = client.initialize(json!({"maxReadBytes": 1234})).await;
    let result = &response["result"];
    assert_eq!(
        result["serverInfo"],
        json!({"name": "box", "version": env!("CARGO_PKG_VERSION")})
    );
    let executor = &result["capabilities"]["experimental"][EXECUTOR_KEY];
    assert_eq!(executor["maxReadBytes"], json!(1234));
    assert_eq!(executor["version"], json!(1));
    assert_eq!(executor["box"]["profile"], json!("default"));
    let units = executor["box"]["units"].as_array().unwrap();
    assert_eq!(units.len(), 1);
    assert_eq!(units[0]["backend"], json!("fake"));
    assert_eq!(units[0]["role"], json!("workspace"));
    assert!(
        result["capabilities"]["experimental"]["io.github.christopherdavenport.agenttool/facts"]
            .is_object()
    );
    let sent = fake.record(|record| record.initialize_params.clone());
    assert_eq!(
        sent[0]["capabilities"]["experimental"][EXECUTOR_KEY],
        json!({"maxReadBytes": 1234})
    );
    assert_eq!(sent[0]["capabilities"]["elicitation"], json!({}));
    // A second initialize is refused, the session goes on.
    let again = client.initialize(json!({})).await;
    assert_eq!(
        again["error"]["code"],
        json!(jsonrpc::code::INVALID_REQUEST)
    );
    let (_, ping) = client.call(json!("p"), "ping", json!({})).await;
    assert_eq!(ping, json!({"jsonrpc": "2.0", "id": "p", "result": {}}));
}

#[tokio::test]
async fn a_discover_probe_is_method_not_found_and_starts_nothing() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let (_, response) = client.call(json!(1), "server/discover", json!({})).await;
    assert_eq!(response["id"], json!(1));
    assert_eq!(
        response["error"]["code"],
        json!(jsonrpc::code::METHOD_NOT_FOUND)
    );
    let (_, early) = client.call(json!(2), "tools/list", json!({})).await;
    assert_eq!(
        early["error"]["code"],
        json!(jsonrpc::code::INVALID_REQUEST)
    );
    assert_eq!(fake.record(|record| record.starts.len()), 0);
    // It then falls back to initialize, which works.
    let response = client.initialize(json!({})).await;
    assert!(response.get("result").is_some(), "{response}");
}

#[tokio::test]
async fn a_refused_tightening_is_an_error_naming_the_field_and_starts_nothing() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let response = client
        .initialize(json!({"box": {"tighten": {"network": {"mode": "bridge"}}}}))
        .await;
    assert_eq!(
        response["error"]["code"],
        json!(jsonrpc::code::INVALID_PARAMS),
        "{response}"
    );
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("tighten"), "{message}");
    assert_eq!(fake.record(|record| record.starts.len()), 0);
    let wrong_type = client.initialize(json!({"box": {"profile": 7}})).await;
    assert!(
        wrong_type["error"]["message"]
            .as_str()
            .unwrap()
            .contains("box.profile"),
        "{wrong_type}"
    );
    assert_eq!(fake.record(|record| record.starts.len()), 0);
}

#[tokio::test]
async fn a_failed_unit_removes_the_others_and_the_error_names_it() {
    let fake = FakeBackend::new(FakeOptions {
        fail_unit: Some("u2".to_owned()),
        ..FakeOptions::default()
    });
    let client = connect(config_with(&fake, three_units));
    let response = client.initialize(json!({})).await;
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("u2"), "{message}");
    assert_eq!(fake.record(|record| record.starts.len()), 3);
    assert_eq!(fake.live_units(), Vec::<String>::new());
    let removed = fake.record(|record| record.removed.clone());
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(removed.iter().any(|id| id.contains("workspace")));
    assert!(removed.iter().any(|id| id.contains("u3")));
}

/// The egress socket a backend cannot take (the fake keeps the trait's
/// default capabilities) refuses the session before anything starts: no
/// unit, and no egress proxy, is started for it.
#[tokio::test]
async fn what_the_backend_cannot_wire_in_refuses_the_start_before_any_unit() {
    fn egress_server(
        profile: &Profile,
        tighten: &Value,
        host: &HostFacts,
    ) -> Result<Plan, PlanError> {
        let mut plan = three_units(profile, tighten, host)?;
        plan.units[1].network.mode = box_policy::plan::NetworkMode::Egress;
        Ok(plan)
    }
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, egress_server));
    let response = client.initialize(json!({})).await;
    let message = response["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("u2")
            && message.contains("network egress allow list")
            && message.contains("the fake backend cannot wire the host's egress proxy"),
        "{response}"
    );
    assert_eq!(fake.record(|record| record.starts.len()), 0);
    assert_eq!(fake.live_units(), Vec::<String>::new());
}

#[tokio::test]
async fn ids_keep_their_type_and_sessions_are_isolated() {
    let fake = FakeBackend::default();
    let config = config(&fake);
    let first = connect(config.clone());
    let second = connect(config);
    first.initialize(json!({})).await;
    second.initialize(json!({})).await;
    // The same ids in flight at once, on both sessions, as number and as string.
    let a = first
        .tool(json!(1), "slow", json!({"ms": 50, "who": "first-number"}))
        .await;
    let b = first
        .tool(json!("1"), "slow", json!({"ms": 50, "who": "first-string"}))
        .await;
    let c = second
        .tool(json!(1), "slow", json!({"ms": 50, "who": "second-number"}))
        .await;
    let (_, a) = collect(a).await;
    let (_, b) = collect(b).await;
    let (_, c) = collect(c).await;
    assert_eq!(a["id"], json!(1));
    assert_eq!(b["id"], json!("1"));
    assert_eq!(c["id"], json!(1));
    // Fields the proxy does not know survive.
    assert_eq!(a["result"]["extra"], json!({"kept": true}));
    let (_, echo) = first
        .call(
            json!(9),
            "tools/call",
            json!({"name": "echo", "arguments": {"x": [1, "y"]}}),
        )
        .await;
    assert_eq!(
        echo["result"]["content"][0]["text"],
        json!("{\"x\":[1,\"y\"]}")
    );
    // A reused id in flight is refused.
    let hang = first.tool(json!(5), "hang", json!({})).await;
    let (_, dup) = first
        .call(json!(5), "tools/call", json!({"name": "echo"}))
        .await;
    assert_eq!(dup["error"]["code"], json!(jsonrpc::code::INVALID_REQUEST));
    drop(hang);
    assert_eq!(fake.live_units().len(), 2);
}

#[tokio::test]
async fn progress_tokens_round_trip_before_the_answer() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let (events, response) = client
        .call(
            json!(3),
            "tools/call",
            json!({"name": "slow", "arguments": {"steps": 3, "ms": 30}, "_meta": {"progressToken": "tok"}}),
        )
        .await;
    assert_eq!(events.len(), 3, "{events:?}");
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["method"], json!("notifications/progress"));
        assert_eq!(event["params"]["progressToken"], json!("tok"));
        assert_eq!(event["params"]["progress"], json!(index + 1));
    }
    assert_eq!(response["id"], json!(3));
    assert_eq!(response["result"]["content"][0]["text"], json!("slow done"));
}

#[tokio::test]
async fn a_cancellation_is_translated_into_the_units_id() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let stream = client.tool(json!("c1"), "hang", json!({})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    client
        .session
        .notify(jsonrpc::notification(
            "notifications/cancelled",
            json!({"requestId": "c1", "reason": "user"}),
        ))
        .await
        .unwrap();
    wait_until("the unit sees the cancel", || {
        fake.record(|record| !record.cancelled.is_empty())
    })
    .await;
    let cancelled = fake.record(|record| record.cancelled.clone());
    assert_eq!(cancelled.len(), 1);
    assert!(
        cancelled[0].is_u64(),
        "the unit's own id, not the client's: {cancelled:?}"
    );
    // The client expects no answer: the request is dropped, not answered.
    assert!(
        tokio::time::timeout(WAIT, stream.response)
            .await
            .unwrap()
            .is_err()
    );
    // A cancel of an unknown id goes nowhere.
    client
        .session
        .notify(jsonrpc::notification(
            "notifications/cancelled",
            json!({"requestId": "zz"}),
        ))
        .await
        .unwrap();
    let (_, after) = client.call(json!("c1"), "ping", json!({})).await;
    assert_eq!(after["result"], json!({}));
    assert_eq!(fake.record(|record| record.cancelled.len()), 1);
}

#[tokio::test]
async fn a_units_request_reaches_the_client_and_its_answer_goes_back() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let mut stream = client.tool(json!(0), "ask", json!({})).await;
    let ask = tokio::time::timeout(WAIT, stream.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ask["method"], json!("elicitation/create"));
    let proxy_id = ask["id"].clone();
    assert_ne!(
        proxy_id,
        json!(0),
        "the unit's id 0 must not reach the client as is"
    );
    client
        .session
        .notify(json!({"jsonrpc": "2.0", "id": proxy_id, "result": {"action": "accept", "content": {}}}))
        .await
        .unwrap();
    let (_, response) = collect(stream).await;
    assert_eq!(response["id"], json!(0));
    let text = response["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("accept"), "{text}");
}

#[tokio::test]
async fn a_dying_unit_answers_every_request_in_flight_once_with_the_cause() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let first = client.tool(json!(1), "hang", json!({})).await;
    let second = client.tool(json!(2), "hang", json!({})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = client.tool(json!(3), "die", json!({})).await;
    let started = std::time::Instant::now();
    for (id, stream) in [(1, first), (2, second), (3, third)] {
        let (events, response) = collect(stream).await;
        assert!(events.is_empty());
        assert_eq!(response["id"], json!(id));
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains("unit workspace ended"), "{message}");
        assert_eq!(message.matches("137").count(), 1, "{message}");
        assert_eq!(message.matches("OOM killer").count(), 1, "{message}");
        assert_eq!(response["error"]["data"]["oomKilled"], json!(true));
        assert_eq!(response["error"]["data"]["outcome"], json!("unknown"));
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, later) = client
        .call(json!(4), "tools/call", json!({"name": "echo"}))
        .await;
    let message = later["error"]["message"].as_str().unwrap();
    assert!(message.contains("unit workspace ended"), "{message}");
}

/// Issue 22, item 5: a unit's end can reach the session before what the unit
/// wrote just before it (an answer in the engine's stream or box-init's relay
/// while a frozen host resumes). A call the unit answered before it ended
/// gets that answer; a call it never answered is told its outcome is
/// unknown, never that it did not run; a later call is told the unit ended.
#[tokio::test]
async fn a_call_answered_just_before_its_unit_ended_gets_its_answer_the_rest_unknown() {
    let fake = FakeBackend::new(FakeOptions {
        output_delay: Duration::from_millis(300),
        ..FakeOptions::default()
    });
    let client = connect(config(&fake));
    let init = client.initialize(json!({})).await;
    assert!(init.get("result").is_some(), "{init}");
    let hung = client.tool(json!(1), "hang", json!({})).await;
    let last = client.tool(json!(2), "last", json!({})).await;
    let (_, answered) = collect(last).await;
    assert_eq!(
        answered["result"]["content"][0]["text"],
        json!("last words"),
        "{answered}"
    );
    let (_, unanswered) = collect(hung).await;
    assert_eq!(
        unanswered["error"]["data"]["outcome"],
        json!("unknown"),
        "{unanswered}"
    );
    let message = unanswered["error"]["message"].as_str().unwrap();
    assert!(message.contains("lease lapsed"), "{message}");
    assert!(message.contains("its outcome is unknown"), "{message}");
    let (_, later) = client
        .call(json!(3), "tools/call", json!({"name": "echo"}))
        .await;
    let message = later["error"]["message"].as_str().unwrap();
    assert!(message.contains("unit workspace ended"), "{message}");
    assert!(!message.contains("unknown"), "a call never sent: {message}");
}

/// Issue 8, item 12: a deadline that fires without an answer cannot say the
/// call did not run (it may have, in part or in full): the answer says its
/// outcome is unknown, and the unit is asked to cancel it.
#[tokio::test]
async fn a_call_past_its_deadline_is_answered_once_as_unknown_and_cancelled_in_the_unit() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_deadline));
    client.initialize(json!({})).await;
    let started = std::time::Instant::now();
    let (_, response) = collect(client.tool(json!("d"), "hang", json!({})).await).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(response["id"], json!("d"));
    assert_eq!(
        response["error"]["code"],
        json!(jsonrpc::code::REQUEST_TIMEOUT)
    );
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("call_timeout"), "{message}");
    assert!(message.contains("unknown"), "{message}");
    assert!(!message.contains("was cancelled"), "{message}");
    assert_eq!(response["error"]["data"]["outcome"], json!("unknown"));
    wait_until("the unit sees the cancel", || {
        fake.record(|record| record.cancelled.len() == 1)
    })
    .await;
}

/// Issue 8, item 12: an answer on its way when the deadline fires wins. A
/// host frozen past a call's deadline (SIGSTOP, a stalled VM) finds the
/// unit's answer waiting when it resumes, but the timer's task runs before
/// the answer has crossed the pipes; modelled here by an answer that comes
/// just after the deadline.
#[tokio::test(start_paused = true)]
async fn an_answer_on_its_way_when_the_deadline_fires_wins() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_deadline));
    client.initialize(json!({})).await;
    let slow = client
        .tool(json!(1), "slow", json!({"ms": 210, "steps": 1}))
        .await;
    let (_, answer) = collect(slow).await;
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("slow done"),
        "{answer}"
    );
}

fn short_start(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.limits.start_timeout = Duration::from_millis(300)
    })
}

/// Issue 8, item 14: a start against a stalled engine ends at the profile's
/// start deadline with an error naming the unit; the start that goes on
/// keeps the session (and what it holds) until what it makes is removed.
#[tokio::test]
async fn a_start_past_its_deadline_is_refused_naming_the_unit_and_what_starts_late_is_removed() {
    let fake = FakeBackend::default();
    fake.stall_starts(true);
    let config = config_with(&fake, short_start);
    let client = connect(config.clone());
    let started = std::time::Instant::now();
    let response = client.initialize(json!({})).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("unit workspace"), "{message}");
    assert!(message.contains("start_timeout"), "{message}");
    client.session.end();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !client.session.has_ended(),
        "the session ended while its unit's start went on"
    );
    let left = config.services.ledger.left();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].unit, "workspace");
    assert_eq!(left[0].id, None);
    fake.stall_starts(false);
    tokio::time::timeout(WAIT, client.session.ended())
        .await
        .unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
    assert_eq!(fake.record(|record| record.removed.len()), 1);
    assert_eq!(config.services.ledger.left(), Vec::new());
}

/// Issue 8, item 14: the start deadline is in every envelope's limits.
#[tokio::test]
async fn the_envelope_reports_the_start_deadline() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let response = client.initialize(json!({})).await;
    let units = &response["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]["units"];
    assert_eq!(
        units[0]["limits"]["startTimeoutMs"],
        json!(60_000),
        "{units}"
    );
}

/// Issue 8, item 14: a session ends (and frees what it holds) only once the
/// removal of its units is confirmed; until then the host names them as left.
#[tokio::test]
async fn a_session_ends_only_once_the_removal_of_its_units_is_confirmed() {
    let fake = FakeBackend::default();
    let config = config(&fake);
    let client = connect(config.clone());
    client.initialize(json!({})).await;
    fake.fail_removals(true);
    client.session.end();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !client.session.has_ended(),
        "the session ended with its unit still there"
    );
    let left = config.services.ledger.left();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, Some(fake.live_units()[0].clone()));
    fake.fail_removals(false);
    tokio::time::timeout(WAIT, client.session.ended())
        .await
        .unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
    assert_eq!(config.services.ledger.left(), Vec::new());
}

#[tokio::test]
async fn the_end_of_a_session_removes_its_units() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, three_units));
    client.initialize(json!({})).await;
    assert_eq!(fake.live_units().len(), 3);
    let hang = client.tool(json!(1), "hang", json!({})).await;
    let session = client.session.clone();
    drop(client);
    session.end();
    tokio::time::timeout(WAIT, session.ended()).await.unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
    assert_eq!(fake.record(|record| record.removed.len()), 3);
    let (_, response) = collect(hang).await;
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session ended")
    );
}

#[tokio::test]
async fn an_idle_session_ends_and_its_units_go() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_idle));
    client.initialize(json!({})).await;
    assert_eq!(fake.live_units().len(), 1);
    tokio::time::timeout(WAIT, client.session.ended())
        .await
        .unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
}

#[tokio::test]
async fn server_units_are_listed_started_and_their_process_ids_namespaced() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, three_units));
    client.initialize(json!({})).await;
    let (_, listed) = client
        .call(json!(1), "agentworkspace/servers.list", json!({}))
        .await;
    assert_eq!(
        listed["result"],
        json!({"servers": [
            {"name": "u2", "unit": "u2", "description": "the u2 server"},
            {"name": "u3", "unit": "u3", "description": "the u3 server"},
        ]})
    );
    let (_, started) = client
        .call(
            json!(2),
            "agentworkspace/servers.start",
            json!({"name": "u3"}),
        )
        .await;
    assert_eq!(started["result"]["id"], json!("u3:p1"));
    let (_, workspace) = client
        .call(
            json!(3),
            "agentworkspace/process.start",
            json!({"args": ["ls"]}),
        )
        .await;
    assert_eq!(workspace["result"]["id"], json!("p1"));
    let (_, read) = client
        .call(
            json!(4),
            "agentworkspace/process.read",
            json!({"id": "u3:p1", "fd": 1}),
        )
        .await;
    let data = base64::engine::general_purpose::STANDARD
        .decode(read["result"]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8(data).unwrap(), "ran: u3-server --stdio\n");
    let (_, read) = client
        .call(
            json!(5),
            "agentworkspace/process.read",
            json!({"id": "p1", "fd": 1}),
        )
        .await;
    let data = base64::engine::general_purpose::STANDARD
        .decode(read["result"]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8(data).unwrap(), "ran: ls\n");
    let (_, unknown) = client
        .call(
            json!(6),
            "agentworkspace/servers.start",
            json!({"name": "nope"}),
        )
        .await;
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nope")
    );
    let args = fake.record(|record| record.process_args.clone());
    assert!(args.contains(&json!(["u3-server", "--stdio"])), "{args:?}");
    let _ = client.general;
}

#[tokio::test]
async fn orphans_of_this_instance_are_swept_and_others_kept() {
    let fake = FakeBackend::default();
    let config = config(&fake);
    let label = |instance: &str| box_backend::SessionLabel {
        instance: instance.to_owned(),
        session: "old".to_owned(),
        profile: "default".to_owned(),
    };
    let plan = box_policy::plan::resolve(
        &Catalog::new(Vec::new()).load("default").unwrap(),
        &Value::Null,
        &facts(),
    )
    .unwrap();
    use box_backend::Backend as _;
    let mine = fake
        .start(&label("test-instance"), &plan.units[0])
        .await
        .unwrap();
    let theirs = fake.start(&label("other"), &plan.units[0]).await.unwrap();
    super::sweep_orphans(
        &config.config,
        &config.services,
        None,
        &std::collections::HashSet::new(),
    )
    .await;
    assert_eq!(fake.live_units(), vec![theirs.envelope.id.clone()]);
    assert!(fake.record(|record| record.removed.contains(&mine.envelope.id)));
}

#[tokio::test]
async fn the_tool_list_read_at_start_is_the_only_one_the_client_sees() {
    let fake = FakeBackend::default();
    let mut client = connect(config(&fake));
    client.initialize(json!({})).await;
    let (_, before) = client.call(json!(1), "tools/list", json!({})).await;
    let (_, mutated) = client
        .call(
            json!(2),
            "tools/call",
            json!({"name": "mutate", "arguments": {}}),
        )
        .await;
    assert_eq!(mutated["result"]["content"][0]["text"], json!("mutated"));
    let (_, after) = client.call(json!(3), "tools/list", json!({})).await;
    assert_eq!(before["result"], after["result"]);
    let names: Vec<&str> = after["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"evil"), "{names:?}");
    // The unit's list_changed never reaches the client.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(client.general.try_recv().is_err());
}

fn short_lifetime(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.limits.lifetime = Duration::from_millis(300)
    })
}

#[tokio::test]
async fn a_session_ends_at_its_lifetime_however_busy() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_lifetime));
    client.initialize(json!({})).await;
    let started = std::time::Instant::now();
    let mut id = 0;
    while !client.session.has_ended() {
        assert!(
            started.elapsed() < WAIT,
            "the lifetime did not end the session"
        );
        id += 1;
        if let Ok(stream) = client
            .session
            .request(jsonrpc::request(json!(id), "ping", json!({})))
            .await
        {
            let _ = stream.response.await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(fake.live_units(), Vec::<String>::new());
}

#[tokio::test]
async fn the_audit_log_records_tool_calls_without_their_values() {
    let fake = FakeBackend::default();
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("audit.jsonl");
    let mut services = services(&fake);
    services.audit = Some(Arc::new(super::audit::Audit::open(&path).unwrap()));
    let client = connect(TestHost::new(settings(), services));
    client.initialize(json!({})).await;
    let arguments = json!({"secret": "hunter2"});
    client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "echo", "arguments": arguments}),
        )
        .await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("hunter2"), "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let record = &lines[0];
    assert_eq!(record["tool"], json!("echo"));
    assert_eq!(record["unit"], json!("workspace"));
    assert_eq!(record["session"], json!("s-test"));
    assert_eq!(record["outcome"], json!("ok"));
    assert_eq!(
        record["argumentsSha256"],
        json!(super::audit::digest(&arguments))
    );
    assert!(record["time"].is_string() && record["durationMs"].is_u64());
}

#[tokio::test]
async fn metrics_count_sessions_units_and_calls() {
    let fake = FakeBackend::default();
    let config = config(&fake);
    let client = connect(config.clone());
    client.initialize(json!({})).await;
    client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "echo", "arguments": {}}),
        )
        .await;
    let text = config.services.metrics.render();
    assert!(text.contains("box_sessions_active 1"), "{text}");
    assert!(text.contains("box_units{state=\"running\"} 1"), "{text}");
    assert!(
        text.contains("box_calls_total{method=\"tools/call\",tool=\"echo\",outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(text.contains("box_call_duration_seconds_count 1"), "{text}");
    assert!(
        text.contains("box_unit_start_duration_seconds_count 1"),
        "{text}"
    );
    collect(client.tool(json!(2), "die", json!({})).await).await;
    let text = config.services.metrics.render();
    assert!(text.contains("box_units{state=\"ended\"} 1"), "{text}");
    assert!(text.contains("box_units{state=\"running\"} 0"), "{text}");
    client.session.end();
    client.session.ended().await;
    let text = config.services.metrics.render();
    assert!(text.contains("box_sessions_active 0"), "{text}");
    assert!(text.contains("box_units{state=\"ended\"} 0"), "{text}");
    assert!(text.contains("box_units_removed_total 1"), "{text}");
}

#[tokio::test]
async fn a_session_bounds_its_requests_in_flight() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let mut streams = Vec::new();
    for id in 0..256 {
        streams.push(client.tool(json!(id), "hang", json!({})).await);
    }
    let (_, refused) = client
        .call(json!("over"), "tools/call", json!({"name": "echo"}))
        .await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight"),
        "{refused}"
    );
    drop(streams);
}

#[tokio::test]
async fn host_shutdown_lets_calls_in_flight_finish_then_removes_units() {
    let fake = FakeBackend::default();
    let shutdown = CancellationToken::new();
    let (general, _general_rx) = mpsc::channel(8);
    let host = config(&fake);
    let session = spawn_session(
        host.config,
        host.services,
        "drain".to_owned(),
        general,
        &shutdown,
    );
    let init = session
        .request(jsonrpc::request(
            json!(0),
            "initialize",
            initialize_params(json!({})),
        ))
        .await
        .unwrap();
    collect(init).await;
    let slow = session
        .request(jsonrpc::request(
            json!(1),
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 300}}),
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    shutdown.cancel();
    let (_, answer) = collect(slow).await;
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("slow done"),
        "{answer}"
    );
    tokio::time::timeout(WAIT, session.ended()).await.unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
}

#[tokio::test]
async fn a_unit_sending_an_over_long_message_is_ended_and_its_calls_answered() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    client.initialize(json!({})).await;
    let (_, answer) = collect(client.tool(json!(1), "flood", json!({})).await).await;
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("unit workspace ended"), "{message}");
    assert!(message.contains("at most"), "{message}");
    let (_, ping) = client.call(json!(2), "ping", json!({})).await;
    assert_eq!(ping["result"], json!({}));
}

/// Issue 8, item 13: a request waiting when the idle timer fires (a host
/// frozen past the idle time finds its clients' requests queued when it
/// resumes, behind the timer) keeps the session: what is waiting is read
/// before the session is judged idle.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_when_the_idle_timer_fires_keeps_the_session() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_idle));
    client.initialize(json!({})).await;
    // The idle time is 200 ms; the request comes 10 ms after it ran out.
    tokio::time::sleep(Duration::from_millis(210)).await;
    let (_, answer) = client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "echo", "arguments": {}}),
        )
        .await;
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("{}"),
        "{answer}"
    );
    assert!(!client.session.has_ended());
    // With nothing more, it does end.
    tokio::time::timeout(WAIT, client.session.ended())
        .await
        .unwrap();
}

#[tokio::test]
async fn idle_counts_from_the_last_answer_not_from_a_long_calls_start() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, short_idle));
    client.initialize(json!({})).await;
    // The call outlasts the idle time (200 ms); the session must survive its answer.
    let (_, answer) = client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 400}}),
        )
        .await;
    assert_eq!(answer["result"]["content"][0]["text"], json!("slow done"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!client.session.has_ended());
    let (_, ping) = client.call(json!(2), "ping", json!({})).await;
    assert_eq!(ping["result"], json!({}));
}

#[tokio::test]
async fn a_units_notifications_reach_the_client_on_the_general_channel() {
    let fake = FakeBackend::default();
    let mut client = connect(config(&fake));
    client.initialize(json!({})).await;
    let (events, answer) = client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "log", "arguments": {}}),
        )
        .await;
    assert_eq!(answer["result"]["content"][0]["text"], json!("logged"));
    assert!(events.is_empty(), "{events:?}");
    let log = tokio::time::timeout(WAIT, client.general.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(log["method"], json!("notifications/message"));
    assert_eq!(log["params"]["data"], json!("a log line"));
}

fn servers_only(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.name = "browser".to_owned();
        unit.role = Role::Server;
        unit.command = vec!["browser-server".to_owned()];
    })
}

fn no_units(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    let mut plan = box_policy::plan::resolve(profile, tighten, host)?;
    plan.units.clear();
    Ok(plan)
}

#[tokio::test]
async fn a_session_without_a_workspace_unit_offers_no_tools_but_its_servers() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, servers_only));
    let response = client.initialize(json!({})).await;
    let executor = &response["result"]["capabilities"]["experimental"][EXECUTOR_KEY];
    assert_eq!(executor["box"]["units"][0]["role"], json!("server"));
    assert_eq!(response["result"]["protocolVersion"], json!("2025-06-18"));
    let (_, tools) = client.call(json!(1), "tools/list", json!({})).await;
    assert_eq!(tools["result"], json!({"tools": []}));
    let (_, call) = client
        .call(json!(2), "tools/call", json!({"name": "echo"}))
        .await;
    assert_eq!(
        call["error"]["code"],
        json!(jsonrpc::code::METHOD_NOT_FOUND)
    );
    assert!(
        call["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no workspace unit")
    );
    let (_, started) = client
        .call(
            json!(3),
            "agentworkspace/servers.start",
            json!({"name": "browser"}),
        )
        .await;
    assert_eq!(started["result"]["id"], json!("browser:p1"));
}

#[tokio::test]
async fn a_session_without_units_answers_the_clients_version() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, no_units));
    let mut params = initialize_params(json!({}));
    params["protocolVersion"] = json!("2025-11-25");
    let (_, response) = client.call(json!(0), "initialize", params).await;
    assert_eq!(response["result"]["protocolVersion"], json!("2025-11-25"));
    assert_eq!(response["result"]["serverInfo"]["name"], json!("box"));
    assert_eq!(fake.record(|record| record.starts.len()), 0);
}

#[tokio::test]
async fn a_malformed_initialize_is_invalid_params_naming_the_field_and_starts_nothing() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let valid = initialize_params(json!({}));
    let mut version_a_number = valid.clone();
    version_a_number["protocolVersion"] = json!(5);
    let mut no_version = valid.clone();
    no_version
        .as_object_mut()
        .unwrap()
        .remove("protocolVersion");
    let mut no_client_info = valid.clone();
    no_client_info.as_object_mut().unwrap().remove("clientInfo");
    let mut nameless_client = valid.clone();
    nameless_client["clientInfo"] = json!({"version": "1"});
    let mut capabilities_a_list = valid.clone();
    capabilities_a_list["capabilities"] = json!([]);
    let cases = [
        (
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize"}),
            "params",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": "x"}),
            "params",
        ),
        (
            jsonrpc::request(json!(0), "initialize", version_a_number),
            "params.protocolVersion",
        ),
        (
            jsonrpc::request(json!(0), "initialize", no_version),
            "params.protocolVersion",
        ),
        (
            jsonrpc::request(json!(0), "initialize", no_client_info),
            "params.clientInfo",
        ),
        (
            jsonrpc::request(json!(0), "initialize", nameless_client),
            "params.clientInfo.name",
        ),
        (
            jsonrpc::request(json!(0), "initialize", capabilities_a_list),
            "params.capabilities",
        ),
    ];
    for (message, field) in cases {
        let (_, response) = collect(client.session.request(message.clone()).await.unwrap()).await;
        assert_eq!(
            response["error"]["code"],
            json!(jsonrpc::code::INVALID_PARAMS),
            "{message} → {response}"
        );
        let text = response["error"]["message"].as_str().unwrap();
        assert!(text.starts_with(&format!("{field}:")), "{field}: {text}");
    }
    assert_eq!(fake.record(|record| record.starts.len()), 0);
    // The session is still waiting for a good initialize.
    let response = client.initialize(json!({})).await;
    assert!(response.get("result").is_some(), "{response}");
}

#[tokio::test]
async fn params_that_are_not_an_object_are_invalid_params() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let raw = |id: u64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let (_, early) = collect(
        client
            .session
            .request(raw(1, "ping", json!("x")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(early["error"]["code"], json!(jsonrpc::code::INVALID_PARAMS));
    client.initialize(json!({})).await;
    for (id, method, params) in [
        (2, "tools/list", json!("x")),
        (3, "tools/list", json!([1, 2])),
        (4, "tools/call", json!(["echo", {}])),
        (5, "ping", json!(7)),
    ] {
        let (_, response) = collect(
            client
                .session
                .request(raw(id, method, params))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(response["id"], json!(id), "{response}");
        assert_eq!(
            response["error"]["code"],
            json!(jsonrpc::code::INVALID_PARAMS),
            "{method}: {response}"
        );
        assert!(
            response["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("params: must be an object"),
            "{response}"
        );
    }
    // Absent or null params are no params at all.
    let (_, ping) = collect(
        client
            .session
            .request(json!({"jsonrpc": "2.0", "id": 6, "method": "ping", "params": null}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(ping["result"], json!({}));
}

#[tokio::test]
async fn initialize_agrees_to_a_version_box_speaks_and_the_executors_get_it() {
    for (requested, agreed) in [
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2024-11-05"),
        ("1999-01-01", jsonrpc::LATEST_PROTOCOL_VERSION),
        ("2026-07-28", jsonrpc::LATEST_PROTOCOL_VERSION),
    ] {
        let fake = FakeBackend::default();
        let client = connect(config(&fake));
        let mut params = initialize_params(json!({}));
        params["protocolVersion"] = json!(requested);
        let (_, response) = client.call(json!(0), "initialize", params).await;
        assert_eq!(response["result"]["protocolVersion"], json!(agreed));
        assert_eq!(client.session.protocol_version(), Some(agreed));
        let sent = fake.record(|record| record.initialize_params.clone());
        assert_eq!(sent[0]["protocolVersion"], json!(agreed), "{requested}");
    }
}

/// Every secret value the session knows (handed to a unit, or a credential
/// of the host's environment) is redacted from what the client receives:
/// tool results, and process output read in chunks that split the value.
#[tokio::test]
async fn secret_values_are_redacted_from_results_and_chunked_process_output() {
    const DEPLOY: &str = "deploy-key-0123456789abcdef";
    const TOKEN: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
    let fake = FakeBackend::default();
    let mut config = settings();
    config.resolve = |profile, tighten, host| {
        one_unit(profile, tighten, host, |unit| {
            unit.env_secrets = vec!["DEPLOY_KEY".to_owned()]
        })
    };
    config.environment = || {
        [
            ("DEPLOY_KEY", DEPLOY),
            ("GITHUB_TOKEN", TOKEN),
            ("LANG", "C.UTF-8"),
        ]
        .iter()
        .map(|(name, value)| (name.into(), value.into()))
        .collect()
    };
    let client = connect(TestHost::new(config, services(&fake)));
    let init = client.initialize(json!({})).await;
    assert!(init.get("result").is_some(), "{init}");

    let arguments =
        json!({"deploy": DEPLOY, "token": base64::engine::general_purpose::STANDARD.encode(TOKEN)});
    let (_, echoed) = collect(client.tool(json!(1), "echo", arguments).await).await;
    let text = echoed["result"]["content"][0]["text"].as_str().unwrap();
    assert!(!text.contains(DEPLOY) && !text.contains("Z2hwX2"), "{text}");
    assert!(text.contains("[REDACTED:DEPLOY_KEY]"), "{text}");
    assert!(text.contains("[REDACTED:GITHUB_TOKEN]"), "{text}");

    let (_, started) = client
        .call(
            json!(2),
            "agentworkspace/process.start",
            json!({"args": ["echo", DEPLOY]}),
        )
        .await;
    let id = started["result"]["id"].as_str().unwrap().to_owned();
    let mut output = Vec::new();
    let mut reads = 0;
    for request in 3..100 {
        let (_, read) = client
            .call(
                json!(request),
                "agentworkspace/process.read",
                json!({"id": id, "fd": 1, "max": 9}),
            )
            .await;
        reads += 1;
        if let Some(data) = read["result"]["data"].as_str() {
            output.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            );
        }
        if read["result"]["eof"] == json!(true) {
            break;
        }
    }
    assert!(reads > 3, "the value was read in pieces");
    assert_eq!(
        String::from_utf8(output).unwrap(),
        "ran: echo [REDACTED:DEPLOY_KEY]\n"
    );
}

/// Issue 11: a fork the session cannot have is refused naming why, before
/// anything is copied or started.
#[tokio::test]
async fn a_fork_that_cannot_be_given_is_refused_naming_why_and_starts_nothing() {
    let refused = |response: &Value, says: &str| {
        assert_eq!(
            response["error"]["code"],
            json!(jsonrpc::code::INVALID_PARAMS),
            "{response}"
        );
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{says}: {message}");
    };
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let response = client
        .initialize(json!({"box": {"profile": "no-fs"}}))
        .await;
    assert!(response.get("result").is_some(), "{response}");
    let (_, response) = client.call(json!(1), "box/fork", json!({})).await;
    refused(&response, "no workspace unit");

    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let response = client
        .initialize(json!({"box": {"tighten": {"workspace": {"mode": "ro"}}}}))
        .await;
    assert!(response.get("result").is_some(), "{response}");
    let (_, response) = client.call(json!(1), "box/fork", json!({})).await;
    refused(&response, "read-only");
    // Worktree needs a confined git runner and a backend that shows the
    // parent's objects in a unit (the fake has neither here).
    let (_, response) = client
        .call(
            json!(2),
            "box/fork",
            json!({"mode": "worktree", "writable": false}),
        )
        .await;
    refused(&response, "worktree needs");
    let (_, response) = client.call(json!(3), "box/fork", json!({"depth": 1})).await;
    refused(&response, "unknown parameter `depth`");
    let (_, response) = client
        .call(json!(4), "box/merge", json!({"unit": "workspace"}))
        .await;
    refused(&response, "not a fork");
    let (_, response) = client
        .call(json!(5), "box/discard", json!({"unit": "fork-9"}))
        .await;
    refused(&response, "no unit fork-9");
    let (_, response) = client
        .call(
            json!(6),
            "tools/call",
            json!({"name": "echo", "arguments": {}, "_meta": {"box/unit": "fork-9"}}),
        )
        .await;
    refused(&response, "no unit `fork-9`");
    assert_eq!(fake.record(|record| record.starts.len()), 1);
}

/// The host's log lines while a test runs (this thread's, which a
/// current-thread runtime's tasks share).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Capture this thread's log lines until the guard drops.
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Issue 22, item 1: a secret value a unit sends toward the client reaches it
/// redacted whatever kind of message carries it: a result, an error and its
/// `data`, progress, a log, resource and list notifications, a request of the
/// client made during a call and between calls, the tool list the host
/// answers from, the cause of the unit's end; and the host's log lines about
/// the unit never show it either.
#[tokio::test]
async fn a_secret_never_reaches_the_client_raw_through_any_kind_of_unit_message() {
    const SECRET: &str = "leak-canary-5c0e1d2f3a4b9e8d";
    const MARK: &str = "[REDACTED:CANARY_KEY]";
    let (logs, _guard) = Logs::capture();
    let fake = FakeBackend::new(FakeOptions {
        leak_description: Some(format!("lists {SECRET}")),
        ..FakeOptions::default()
    });
    let mut config = settings();
    config.resolve = |profile, tighten, host| {
        one_unit(profile, tighten, host, |unit| {
            unit.env_secrets = vec!["CANARY_KEY".to_owned()]
        })
    };
    config.environment = || vec![("CANARY_KEY".into(), SECRET.into())];
    let mut client = connect(TestHost::new(config, services(&fake)));
    let init = client.initialize(json!({})).await;
    assert!(init.get("result").is_some(), "{init}");
    let mut seen: Vec<Value> = Vec::new();

    let (_, tools) = client.call(json!(1), "tools/list", json!({})).await;
    assert!(tools.to_string().contains(MARK), "{tools}");
    seen.push(tools);

    let leak = |id: i64, answer: &str| {
        json!({"name": "leak", "arguments": {"value": SECRET, "as": answer},
            "_meta": {"progressToken": format!("t{id}")}})
    };
    let mut general = Vec::new();
    for (id, answer) in [(2, "result"), (3, "error")] {
        let (events, response) = client.call(json!(id), "tools/call", leak(id, answer)).await;
        let progress = events
            .iter()
            .find(|event| event["method"] == json!("notifications/progress"))
            .unwrap_or_else(|| panic!("no progress on the call's stream: {events:?}"));
        assert_eq!(progress["params"]["progressToken"], json!(format!("t{id}")));
        assert!(progress.to_string().contains(MARK), "{progress}");
        let asked = events
            .iter()
            .find(|event| event["method"] == json!("elicitation/create"))
            .unwrap_or_else(|| panic!("no request on the call's stream: {events:?}"));
        assert!(asked.to_string().contains(MARK), "{asked}");
        if answer == "error" {
            assert_eq!(
                response["error"]["data"]["value"],
                json!(MARK),
                "{response}"
            );
            assert_eq!(
                response["error"]["data"]["nested"][0],
                json!(MARK),
                "{response}"
            );
        } else {
            assert_eq!(
                response["result"]["structuredContent"]["value"],
                json!(MARK)
            );
        }
        seen.extend(events);
        seen.push(response);
        // The unit's last word is a request of the client between calls.
        loop {
            let message = tokio::time::timeout(WAIT, client.general.recv())
                .await
                .expect("the unit's messages between calls")
                .unwrap();
            let last = message["method"] == json!("roots/list");
            general.push(message);
            if last {
                break;
            }
        }
    }
    for method in [
        "notifications/message",
        "notifications/resources/updated",
        "roots/list",
    ] {
        let message = general
            .iter()
            .find(|message| message["method"] == json!(method))
            .unwrap_or_else(|| panic!("no {method} on the general channel: {general:?}"));
        assert!(message.to_string().contains(MARK), "{message}");
    }
    seen.extend(general);

    // The unit ends with the value in its cause: the call in flight and the
    // next one are told the cause, redacted.
    let (_, died) = client.call(json!(4), "tools/call", leak(4, "die")).await;
    assert!(
        died["error"]["message"].as_str().unwrap().contains(MARK),
        "{died}"
    );
    let (_, after) = client
        .call(
            json!(5),
            "tools/call",
            json!({"name": "echo", "arguments": {}}),
        )
        .await;
    assert!(
        after["error"]["message"].as_str().unwrap().contains(MARK),
        "{after}"
    );
    seen.push(died);
    seen.push(after);
    while let Ok(message) = client.general.try_recv() {
        seen.push(message);
    }

    let encoded = base64::engine::general_purpose::STANDARD.encode(SECRET);
    for message in &seen {
        let text = message.to_string();
        assert!(
            !text.contains(SECRET) && !text.contains(&encoded),
            "the client got the value raw: {text}"
        );
    }
    let logs = logs.text();
    assert!(logs.contains("a unit announced a changed list"), "{logs}");
    assert!(
        logs.contains(MARK),
        "the log names the unit's words, redacted: {logs}"
    );
    assert!(!logs.contains(SECRET), "the host logged the value: {logs}");
}

/// The audit lines of `path`, parsed.
fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Issue 22, item 14: a refused `initialize` (a widening, a bad profile, a
/// bad header, a malformed box ask) is a WARN line, an audit line (with the
/// profile asked and the client's name and version) and a count in
/// `box_sessions_refused{reason}`; the session starts nothing.
#[tokio::test]
async fn a_refused_initialize_is_logged_audited_and_counted() {
    let (logs, _guard) = Logs::capture();
    let fake = FakeBackend::default();
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("audit.jsonl");
    let mut services = services(&fake);
    services.audit = Some(Arc::new(super::audit::Audit::open(&path).unwrap()));
    let config = TestHost::new(settings(), services);
    let refuse = |ask: Value, transport: super::TransportAsk| {
        let config = config.clone();
        async move {
            let shutdown = CancellationToken::new();
            let (general, _general) = mpsc::channel(8);
            let session = super::spawn_session_asking(
                config.config,
                config.services,
                "s-refused".to_owned(),
                general,
                &shutdown,
                transport,
            );
            let stream = session
                .request(jsonrpc::request(
                    json!(0),
                    "initialize",
                    initialize_params(ask),
                ))
                .await
                .unwrap();
            let (_, response) = collect(stream).await;
            assert!(response.get("error").is_some(), "{response}");
        }
    };
    refuse(
        json!({"box": {"tighten": {"network": {"mode": "bridge"}}}}),
        Default::default(),
    )
    .await;
    refuse(
        json!({"box": {"profile": "no-such-profile"}}),
        Default::default(),
    )
    .await;
    refuse(
        json!({}),
        super::TransportAsk {
            tighten: Some(super::AskPart {
                text: "{not json".to_owned(),
                source: "the Box-Tighten header".to_owned(),
            }),
            ..Default::default()
        },
    )
    .await;
    refuse(json!({"box": {"profile": 7}}), Default::default()).await;
    assert_eq!(fake.record(|record| record.starts.len()), 0);

    let lines = audit_lines(&path);
    let refusals: Vec<(&str, &str)> = lines
        .iter()
        .map(|line| {
            assert_eq!(line["kind"], json!("refusal"), "{line}");
            assert_eq!(line["session"], json!("s-refused"), "{line}");
            assert_eq!(
                line["client"],
                json!({"name": "test", "version": "1"}),
                "{line}"
            );
            assert!(
                line["detail"]
                    .as_str()
                    .is_some_and(|detail| !detail.is_empty())
            );
            (
                line["reason"].as_str().unwrap(),
                line["profile"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("widening", "default"),
            ("profile", "no-such-profile"),
            ("ask", "-"),
            ("ask", "-"),
        ]
    );
    let metrics = config.services.metrics.render();
    for (reason, count) in [("widening", 1), ("profile", 1), ("ask", 2)] {
        let series = format!("box_sessions_refused_total{{reason=\"{reason}\"}} {count}");
        assert!(metrics.contains(&series), "{series}: {metrics}");
    }
    let logs = logs.text();
    let warned: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("refused"))
        .collect();
    assert_eq!(warned.len(), 4, "{logs}");
    assert!(
        warned[0].contains("reason=\"widening\"") || warned[0].contains("reason=widening"),
        "{logs}"
    );
    assert!(
        warned[2].contains("Box-Tighten"),
        "the header is named: {logs}"
    );
}

/// Issue 22, item 14: a call's audit line carries the session's profile,
/// the client's name and version, and its real outcome: a `bash` call that
/// exits 3 is `failed` with `exitStatus: 3` and `isError: false`, never
/// `ok`; one that exits 0 is `ok`.
#[tokio::test]
async fn a_calls_audit_line_says_its_profile_client_and_real_outcome() {
    let fake = FakeBackend::default();
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("audit.jsonl");
    let mut services = services(&fake);
    services.audit = Some(Arc::new(super::audit::Audit::open(&path).unwrap()));
    let config = TestHost::new(settings(), services);
    let client = connect(config.clone());
    let init = client.initialize(json!({})).await;
    assert!(init.get("result").is_some(), "{init}");
    for (id, command) in [(1, "exit 3"), (2, "true")] {
        let (_, answer) = collect(
            client
                .tool(json!(id), "bash", json!({"command": command}))
                .await,
        )
        .await;
        assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    }
    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["profile"], json!("default"), "{line}");
        assert_eq!(
            line["client"],
            json!({"name": "test", "version": "1"}),
            "{line}"
        );
        assert_eq!(line["tool"], json!("bash"), "{line}");
        assert_eq!(line["isError"], json!(false), "{line}");
    }
    assert_eq!(lines[0]["outcome"], json!("failed"), "{}", lines[0]);
    assert_eq!(lines[0]["exitStatus"], json!(3), "{}", lines[0]);
    assert_eq!(lines[1]["outcome"], json!("ok"), "{}", lines[1]);
    assert_eq!(lines[1]["exitStatus"], json!(0), "{}", lines[1]);
    let metrics = config.services.metrics.render();
    assert!(
        metrics
            .contains("box_calls_total{method=\"tools/call\",tool=\"other\",outcome=\"failed\"} 1"),
        "{metrics}"
    );
}

/// `box/units.stats` answers for each running unit of the session (the
/// fake backend reports no usage: each entry says why), one when `unit`
/// names it, and refuses an unknown unit or parameter naming what it takes.
#[tokio::test]
async fn units_stats_answers_per_unit_and_refuses_what_it_does_not_know() {
    let fake = FakeBackend::default();
    let client = connect(config_with(&fake, three_units));
    let response = client.initialize(json!({})).await;
    assert!(response.get("result").is_some(), "{response}");
    let (_, all) = client.call(json!(1), "box/units.stats", json!({})).await;
    let units = all["result"]["units"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = units.iter().filter_map(|u| u["unit"].as_str()).collect();
    assert_eq!(names, ["workspace", "u2", "u3"], "{all}");
    for unit in &units {
        assert!(unit["id"].is_string(), "{all}");
        assert!(
            unit["error"]
                .as_str()
                .is_some_and(|e| e.contains("does not report")),
            "{all}"
        );
    }
    let (_, one) = client
        .call(json!(2), "box/units.stats", json!({"unit": "u2"}))
        .await;
    assert_eq!(
        one["result"]["units"].as_array().map(Vec::len),
        Some(1),
        "{one}"
    );
    let (_, unknown) = client
        .call(json!(3), "box/units.stats", json!({"unit": "nope"}))
        .await;
    assert_eq!(unknown["error"]["code"], json!(-32602), "{unknown}");
    let message = unknown["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("nope") && message.contains("u3"),
        "{unknown}"
    );
    let (_, bogus) = client
        .call(json!(4), "box/units.stats", json!({"bogus": 1}))
        .await;
    assert!(
        bogus["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`bogus`")),
        "{bogus}"
    );
}

/// A stateless request's `_meta` (MCP 2026-07-28), with `extra` keys.
fn stateless_meta(extra: Value) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    });
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra.as_object()) {
        meta.extend(extra.clone());
    }
    meta
}

/// A session of id `id` on `host` (sessions of one host share its services).
fn connect_as(host: &TestHost, id: &str) -> Client {
    let shutdown = CancellationToken::new();
    let (general_tx, general) = mpsc::channel(64);
    let session = spawn_session(
        host.config.clone(),
        host.services.clone(),
        id.to_owned(),
        general_tx,
        &shutdown,
    );
    Client {
        session,
        general,
        _shutdown: shutdown,
    }
}

/// Open a stateless session with `box/session.open`; its handle as `_meta`.
async fn open_handle(client: &Client) -> Value {
    let (_, opened) = client
        .call(
            json!("open"),
            "box/session.open",
            json!({"_meta": stateless_meta(json!({}))}),
        )
        .await;
    let result = &opened["result"];
    json!({"box/session": {"id": result["id"], "secret": result["secret"]}})
}

#[tokio::test]
async fn a_tool_calling_client_opens_and_closes_a_session_with_tools() {
    let fake = FakeBackend::default();
    let host = config(&fake);
    let client = connect_as(&host, "s-tools");
    // Closing before anything is open says how to.
    let (_, early) = client
        .call(
            json!(2),
            "tools/call",
            json!({"name": "box_session_close", "arguments": {}, "_meta": stateless_meta(json!({}))}),
        )
        .await;
    assert_eq!(early["result"]["isError"], json!(true), "{early}");
    assert_eq!(fake.record(|record| record.starts.len()), 0);
    // An unknown argument is the tool's error, named as the tool.
    let (_, wrong) = client
        .call(
            json!(3),
            "tools/call",
            json!({"name": "box_session_open", "arguments": {"bogus": 1}, "_meta": stateless_meta(json!({}))}),
        )
        .await;
    let text = wrong["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        wrong["result"]["isError"] == json!(true)
            && text.starts_with("box_session_open: unknown parameter `bogus`"),
        "{wrong}"
    );
    let (_, opened) = client
        .call(
            json!(4),
            "tools/call",
            json!({"name": "box_session_open", "arguments": {"profile": "default", "maxReadBytes": 4096}, "_meta": stateless_meta(json!({}))}),
        )
        .await;
    let result = &opened["result"];
    assert_eq!(result["isError"], json!(false), "{opened}");
    let answer = &result["structuredContent"];
    assert_eq!(answer["id"], json!("s-tools"));
    assert_eq!(answer["profile"], json!("default"));
    assert_eq!(answer["units"][0]["role"], json!("workspace"));
    assert_eq!(answer["executor"]["maxReadBytes"], json!(4096));
    let secret = answer["secret"].as_str().unwrap();
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, answer, "the text is the structured content");
    let handle = json!({"box/session": {"id": "s-tools", "secret": secret}});
    let (_, echoed) = client
        .call(
            json!(5),
            "tools/call",
            json!({"name": "echo", "arguments": {"n": 5}, "_meta": stateless_meta(handle.clone())}),
        )
        .await;
    assert_eq!(
        echoed["result"]["content"][0]["text"],
        json!("{\"n\":5}"),
        "{echoed}"
    );
    let (_, listed) = client
        .call(
            json!(6),
            "tools/list",
            json!({"_meta": stateless_meta(handle.clone())}),
        )
        .await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(
        names.contains(&"box_session_open") && names.contains(&"box_session_close"),
        "{listed}"
    );
    // A second open is refused.
    let (_, again) = client
        .call(
            json!(7),
            "tools/call",
            json!({"name": "box_session_open", "arguments": {}, "_meta": stateless_meta(handle.clone())}),
        )
        .await;
    assert_eq!(again["result"]["isError"], json!(true), "{again}");
    let (_, closed) = client
        .call(
            json!(8),
            "tools/call",
            json!({"name": "box_session_close", "arguments": {}, "_meta": stateless_meta(handle)}),
        )
        .await;
    assert_eq!(
        closed["result"]["structuredContent"],
        json!({"closed": "s-tools"}),
        "{closed}"
    );
    client.session.ended().await;
    assert!(fake.live_units().is_empty(), "the close removed the units");
}

/// The `ask` tool's elicitation as MCP 2026-07-28's "input required": the
/// call answered with the request and a sealed state, the retry under a new
/// id answered with the call's result.
#[tokio::test]
async fn a_units_request_during_a_stateless_call_is_input_required_and_the_retry_gets_the_result() {
    let fake = FakeBackend::default();
    let host = config(&fake);
    let client = connect_as(&host, "s-input");
    let handle = open_handle(&client).await;
    let ask = |id: i64, extra: Value| {
        let mut params =
            json!({"name": "ask", "arguments": {}, "_meta": stateless_meta(handle.clone())});
        if let (Some(params), Some(extra)) = (params.as_object_mut(), extra.as_object()) {
            params.extend(extra.clone());
        }
        (json!(id), params)
    };
    let (id, params) = ask(1, json!({}));
    let (events, first) = client.call(id, "tools/call", params).await;
    assert!(
        events.is_empty(),
        "nothing is sent to the client but the answer: {events:?}"
    );
    let result = &first["result"];
    assert_eq!(result["resultType"], json!("input_required"), "{first}");
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1);
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], json!("elicitation/create"));
    assert_eq!(request["params"]["message"], json!("proceed?"));
    let state = result["requestState"].as_str().unwrap().to_owned();
    assert!(state.starts_with("box1.s-input."), "{state}");

    // A changed state, one for another call, no answers: refused, nothing lost.
    // A character inside the MAC, not its last: the last one of unpadded
    // base64 carries unused bits, and flipping only those makes a state
    // that does not decode (refused as foreign) rather than one that does
    // not verify (when the MAC ends in `A`: one run in sixteen).
    let mut forged = state.clone().into_bytes();
    let inside = forged.len() - 10;
    forged[inside] = if forged[inside] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let accept = json!({key.clone(): {"action": "accept", "content": {"ok": true}}});
    let (id, params) = ask(2, json!({"requestState": forged, "inputResponses": accept}));
    let (_, refused) = client.call(id, "tools/call", params).await;
    let why = refused["error"]["message"].as_str().unwrap();
    assert!(why.contains("does not verify"), "{refused}");
    let (id, mut params) = ask(3, json!({"requestState": state, "inputResponses": accept}));
    params["name"] = json!("echo");
    let (_, other) = client.call(id, "tools/call", params).await;
    assert!(
        other["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not tools/call `echo`"),
        "{other}"
    );
    let (id, params) = ask(4, json!({"requestState": state, "inputResponses": {}}));
    let (_, missing) = client.call(id, "tools/call", params).await;
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no answer to"),
        "{missing}"
    );
    // Another session of the same host refuses it.
    let elsewhere = connect_as(&host, "s-other");
    let other_handle = open_handle(&elsewhere).await;
    let (_, stolen) = elsewhere
        .call(
            json!(1),
            "tools/call",
            json!({"name": "ask", "arguments": {}, "requestState": state, "inputResponses": accept,
                "_meta": stateless_meta(other_handle)}),
        )
        .await;
    assert!(
        stolen["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another box session"),
        "{stolen}"
    );

    let (id, params) = ask(5, json!({"requestState": state, "inputResponses": accept}));
    let (_, answered) = client.call(id, "tools/call", params).await;
    assert_eq!(answered["id"], json!(5));
    let text = answered["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("accept") && text.contains("\"ok\":true"),
        "{answered}"
    );
    // A state serves once.
    let (id, params) = ask(6, json!({"requestState": state, "inputResponses": accept}));
    let (_, replayed) = client.call(id, "tools/call", params).await;
    assert!(
        replayed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer waits"),
        "{replayed}"
    );
    // A handshake-era session still gets the unit's request relayed
    // (`a_units_request_reaches_the_client_and_its_answer_goes_back`).
}

/// A retry reaching a session not open yet is refused without starting one.
#[tokio::test]
async fn a_retry_without_a_session_is_refused_and_starts_nothing() {
    let fake = FakeBackend::default();
    let client = connect(config(&fake));
    let (_, refused) = client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "ask", "arguments": {}, "requestState": "box1.x.y.z",
                "_meta": stateless_meta(json!({}))}),
        )
        .await;
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    assert_eq!(fake.record(|record| record.starts.len()), 0);
}

/// Over stdio a client's first request opens the process's one session
/// (a tool-calling client lists the tools first): a later open, as the
/// method or the tool, names that session's handle rather than failing,
/// unless it asks for what the session was not opened with.
#[tokio::test]
async fn an_open_after_a_request_opened_the_session_names_its_handle() {
    let fake = FakeBackend::default();
    let client = connect_as(&config(&fake), "s-first");
    let (_, listed) = client
        .call(
            json!(1),
            "tools/list",
            json!({"_meta": stateless_meta(json!({}))}),
        )
        .await;
    assert!(listed.to_string().contains("box_session_open"), "{listed}");
    let (_, other) = client
        .call(
            json!(2),
            "tools/call",
            json!({"name": "box_session_open", "arguments": {"profile": "ci"}, "_meta": stateless_meta(json!({}))}),
        )
        .await;
    let why = other["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        other["result"]["isError"] == json!(true) && why.contains("profile `default`"),
        "{other}"
    );
    let (_, opened) = client
        .call(
            json!(3),
            "tools/call",
            json!({"name": "box_session_open", "arguments": {"profile": "default"}, "_meta": stateless_meta(json!({}))}),
        )
        .await;
    let answer = &opened["result"]["structuredContent"];
    assert_eq!(answer["id"], json!("s-first"), "{opened}");
    let handle = json!({"box/session": {"id": "s-first", "secret": answer["secret"]}});
    let (_, echoed) = client
        .call(
            json!(4),
            "tools/call",
            json!({"name": "echo", "arguments": {"n": 4}, "_meta": stateless_meta(handle)}),
        )
        .await;
    assert_eq!(echoed["result"]["content"][0]["text"], json!("{\"n\":4}"));
    // Now it has a handle: another open is refused.
    let (_, again) = client
        .call(
            json!(5),
            "box/session.open",
            json!({"_meta": stateless_meta(json!({}))}),
        )
        .await;
    assert_eq!(again["error"]["code"], json!(-32600), "{again}");
    assert_eq!(fake.record(|record| record.starts.len()), 1);
}

fn long_calls(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    one_unit(profile, tighten, host, |unit| {
        unit.limits.call_timeout = Duration::from_secs(3600);
        unit.limits.idle = Duration::from_secs(7200);
        unit.limits.lifetime = Duration::from_secs(7200);
    })
}

/// A round of input its client never answers outlives its request state
/// (`INPUT_TTL`): the call waiting for it is cancelled in its unit, and a
/// retry that comes later is refused saying so.
#[tokio::test(start_paused = true)]
async fn a_round_of_input_left_unanswered_cancels_its_call() {
    let fake = FakeBackend::default();
    let client = connect_as(&config_with(&fake, long_calls), "s-ttl");
    let handle = open_handle(&client).await;
    let (_, first) = client
        .call(
            json!(1),
            "tools/call",
            json!({"name": "ask", "arguments": {}, "_meta": stateless_meta(handle.clone())}),
        )
        .await;
    let result = &first["result"];
    assert_eq!(result["resultType"], json!("input_required"), "{first}");
    let key = result["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let state = result["requestState"].clone();
    tokio::time::sleep(crate::request_state::INPUT_TTL + Duration::from_secs(1)).await;
    wait_until("the unit is told to cancel the call", || {
        fake.record(|record| record.cancelled.len()) == 1
    })
    .await;
    let (_, late) = client
        .call(
            json!(2),
            "tools/call",
            json!({"name": "ask", "arguments": {}, "requestState": state,
                "inputResponses": {key: {"action": "decline"}}, "_meta": stateless_meta(handle)}),
        )
        .await;
    assert_eq!(late["error"]["code"], json!(-32602), "{late}");
    assert!(
        late["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer waits"),
        "{late}"
    );
}

/// A stateless request's `_meta` with `handle`, declaring MCP's tasks extension.
fn task_meta(handle: &Value) -> Value {
    let mut extra = handle.clone();
    extra["io.modelcontextprotocol/clientCapabilities"] =
        json!({"elicitation": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}});
    stateless_meta(extra)
}

impl Client {
    /// A `tools/call` of `name` as a task; its answer.
    async fn task_call(&self, id: Value, handle: &Value, name: &str, arguments: Value) -> Value {
        let params = json!({"name": name, "arguments": arguments, "_meta": task_meta(handle)});
        self.call(id, "tools/call", params).await.1
    }

    /// `method {taskId: task}` with `handle`; its answer.
    async fn task_method(&self, method: &str, handle: &Value, task: &Value, extra: Value) -> Value {
        let mut params = json!({"taskId": task, "_meta": stateless_meta(handle.clone())});
        if let (Some(params), Some(extra)) = (params.as_object_mut(), extra.as_object()) {
            params.extend(extra.clone());
        }
        self.call(json!("t"), method, params).await.1
    }

    /// Poll `tasks/get` until the task's status is `status`; the last answer.
    async fn poll_task(&self, handle: &Value, task: &Value, status: &str) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = self.task_method("tasks/get", handle, task, json!({})).await;
            if got["result"]["status"] == json!(status) {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task never became {status}: {got}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// MCP's tasks extension: a call that declares it is answered at once with
/// a task, which `tasks/get` reports working then completed with the call's
/// result; a call that does not is answered as before; another session
/// knows nothing of the task; `server/discover` advertises the extension.
#[tokio::test]
async fn a_call_that_declares_the_tasks_extension_becomes_a_task_polled_to_its_result() {
    let fake = FakeBackend::default();
    let host = config(&fake);
    let client = connect_as(&host, "s-task");
    let (_, discovered) = client
        .call(
            json!(0),
            "server/discover",
            json!({"_meta": stateless_meta(json!({}))}),
        )
        .await;
    assert_eq!(
        discovered["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({}),
        "{discovered}"
    );
    let handle = open_handle(&client).await;
    let created = client
        .task_call(json!(1), &handle, "slow", json!({"ms": 300, "steps": 1}))
        .await;
    assert_eq!(created["id"], json!(1));
    let task = &created["result"];
    assert_eq!(task["resultType"], json!("task"), "{created}");
    assert_eq!(task["status"], json!("working"), "{created}");
    assert!(
        task["createdAt"].as_str().unwrap().ends_with('Z'),
        "{created}"
    );
    let id = task["taskId"].clone();
    assert!(
        id.as_str().is_some_and(|id| id.len() >= 32),
        "an unguessable id: {created}"
    );
    let (_, plain) = client
        .call(
            json!(2),
            "tools/call",
            json!({"name": "echo", "arguments": {"n": 2}, "_meta": stateless_meta(handle.clone())}),
        )
        .await;
    assert_eq!(
        plain["result"]["content"][0]["text"],
        json!("{\"n\":2}"),
        "{plain}"
    );
    let working = client
        .task_method("tasks/get", &handle, &id, json!({}))
        .await;
    assert_eq!(working["result"]["status"], json!("working"), "{working}");
    let done = client.poll_task(&handle, &id, "completed").await;
    let result = &done["result"]["result"];
    assert_eq!(result["content"][0]["text"], json!("slow done"), "{done}");
    assert_eq!(result["resultType"], json!("complete"), "{done}");
    // Another session of the same host does not know the task.
    let elsewhere = connect_as(&host, "s-task-other");
    let other_handle = open_handle(&elsewhere).await;
    let stolen = elsewhere
        .task_method("tasks/get", &other_handle, &id, json!({}))
        .await;
    assert_eq!(stolen["error"]["code"], json!(-32602), "{stolen}");
    assert!(
        stolen["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no task"),
        "{stolen}"
    );
    let missing = client
        .call(
            json!(3),
            "tasks/get",
            json!({"_meta": stateless_meta(handle.clone())}),
        )
        .await
        .1;
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`taskId`"),
        "{missing}"
    );
}

/// `tasks/cancel` cancels a working task's call in its unit and the task
/// reports cancelled; a call whose unit dies fails its task with the error.
#[tokio::test]
async fn a_cancelled_task_cancels_its_call_and_a_dead_units_fails_its_task() {
    let fake = FakeBackend::default();
    let client = connect_as(&config(&fake), "s-cancel");
    let handle = open_handle(&client).await;
    let created = client.task_call(json!(1), &handle, "hang", json!({})).await;
    let id = created["result"]["taskId"].clone();
    let cancelled = client
        .task_method("tasks/cancel", &handle, &id, json!({}))
        .await;
    assert_eq!(cancelled["result"], json!({}), "{cancelled}");
    wait_until("the unit is told to cancel the call", || {
        fake.record(|record| record.cancelled.len()) == 1
    })
    .await;
    let got = client
        .task_method("tasks/get", &handle, &id, json!({}))
        .await;
    assert_eq!(got["result"]["status"], json!("cancelled"), "{got}");
    let died = client.task_call(json!(2), &handle, "die", json!({})).await;
    let id = died["result"]["taskId"].clone();
    let failed = client.poll_task(&handle, &id, "failed").await;
    assert!(
        failed["result"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended"),
        "{failed}"
    );
}

/// What a task's unit asks of the client is read with `tasks/get`
/// (`input_required`) and answered with `tasks/update`; the call then
/// completes with the answer.
#[tokio::test]
async fn a_tasks_request_for_input_is_read_with_get_and_answered_with_update() {
    let fake = FakeBackend::default();
    let client = connect_as(&config(&fake), "s-task-input");
    let handle = open_handle(&client).await;
    let created = client.task_call(json!(1), &handle, "ask", json!({})).await;
    let id = created["result"]["taskId"].clone();
    let asked = client.poll_task(&handle, &id, "input_required").await;
    let requests = asked["result"]["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{asked}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], json!("elicitation/create"));
    let updated = client
        .task_method(
            "tasks/update",
            &handle,
            &id,
            json!({"inputResponses": {key.clone(): {"action": "accept", "content": {"ok": true}},
                "not-asked": {"action": "decline"}}}),
        )
        .await;
    assert_eq!(updated["result"], json!({}), "{updated}");
    let done = client.poll_task(&handle, &id, "completed").await;
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains("accept") && text.contains("\"ok\":true"),
        "{done}"
    );
}

/// A session keeps at most 64 tasks: one more is refused naming the limit,
/// until a cancelled (or ended and read) task makes room.
#[tokio::test]
async fn a_session_keeps_a_bounded_number_of_tasks() {
    let fake = FakeBackend::default();
    let client = connect_as(&config(&fake), "s-many");
    let handle = open_handle(&client).await;
    let mut first = Value::Null;
    for n in 0..64 {
        let created = client.task_call(json!(n), &handle, "hang", json!({})).await;
        assert_eq!(created["result"]["status"], json!("working"), "{created}");
        if n == 0 {
            first = created["result"]["taskId"].clone();
        }
    }
    let refused = client
        .task_call(json!(64), &handle, "hang", json!({}))
        .await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 64 tasks"),
        "{refused}"
    );
    client
        .task_method("tasks/cancel", &handle, &first, json!({}))
        .await;
    let room = client
        .task_call(json!(65), &handle, "hang", json!({}))
        .await;
    assert_eq!(room["result"]["resultType"], json!("task"), "{room}");
    let gone = client
        .task_method("tasks/get", &handle, &first, json!({}))
        .await;
    assert_eq!(gone["error"]["code"], json!(-32602), "{gone}");
}

/// A task's result is the unit's answer redacted, as every answer is.
#[tokio::test]
async fn a_tasks_result_is_redacted_as_every_answer_is() {
    const DEPLOY: &str = "deploy-key-0123456789abcdef";
    let fake = FakeBackend::default();
    let mut config = settings();
    config.resolve = |profile, tighten, host| {
        one_unit(profile, tighten, host, |unit| {
            unit.env_secrets = vec!["DEPLOY_KEY".to_owned()]
        })
    };
    config.environment = || {
        [("DEPLOY_KEY", DEPLOY)]
            .iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect()
    };
    let client = connect_as(&TestHost::new(config, services(&fake)), "s-task-secret");
    let handle = open_handle(&client).await;
    let created = client
        .task_call(json!(1), &handle, "echo", json!({"deploy": DEPLOY}))
        .await;
    let id = created["result"]["taskId"].clone();
    let done = client.poll_task(&handle, &id, "completed").await;
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        !text.contains(DEPLOY) && text.contains("[REDACTED:DEPLOY_KEY]"),
        "{done}"
    );
}

/// A task's call keeps the profile's `call_timeout` (the task fails with
/// the timeout), and a working task does not hold its session open.
#[tokio::test]
async fn a_tasks_call_keeps_its_deadline_and_the_task_ends_with_its_session() {
    let fake = FakeBackend::default();
    let client = connect_as(&config_with(&fake, short_deadline), "s-task-deadline");
    let handle = open_handle(&client).await;
    let created = client.task_call(json!(1), &handle, "hang", json!({})).await;
    let id = created["result"]["taskId"].clone();
    let failed = client.poll_task(&handle, &id, "failed").await;
    assert_eq!(
        failed["result"]["error"]["code"],
        json!(jsonrpc::code::REQUEST_TIMEOUT),
        "{failed}"
    );
    client.task_call(json!(2), &handle, "hang", json!({})).await;
    let (_, closed) = client
        .call(
            json!(3),
            "box/session.close",
            json!({"_meta": stateless_meta(handle.clone())}),
        )
        .await;
    assert_eq!(closed["result"], json!({}), "{closed}");
    tokio::time::timeout(WAIT, client.session.ended())
        .await
        .expect("the session ends with a task working");
    assert!(fake.live_units().is_empty(), "the close removed the units");
}
