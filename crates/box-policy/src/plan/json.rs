//! A plan as JSON, for `box profile resolve --json` and anything else that
//! reports a plan: camelCase keys, limits in plain numbers (bytes,
//! milliseconds), keys in a fixed order.

use serde_json::{Value, json};

use super::{
    LocalUserland, Network, NetworkMode, Plan, PullPolicy, Role, UnitSpec, WorkspaceSource, Written,
};

impl Plan {
    /// The plan as JSON: `{"profile", "units": [...]}`.
    pub fn to_json(&self) -> Value {
        let mut plan = json!({
            "profile": self.profile,
            "onPersistedCredentials": self.on_persisted_credentials.as_str(),
            "units": self.units.iter().map(UnitSpec::to_json).collect::<Vec<_>>(),
        });
        if let Some(mode) = self.workspace_fork {
            // The workspace unit's source is forked per session this way.
            plan["workspaceFork"] = json!(mode.as_str());
        }
        plan
    }
}

impl UnitSpec {
    /// One unit as JSON.
    pub fn to_json(&self) -> Value {
        let mut unit = json!({
            "name": self.name,
            "role": match self.role {
                Role::Workspace => "workspace",
                Role::Server => "server",
            },
            "image": self.image,
            "source": match &self.source {
                WorkspaceSource::Host(path) => json!({"kind": "host", "path": path.display().to_string()}),
                WorkspaceSource::Empty => json!({"kind": "empty"}),
                WorkspaceSource::None => json!({"kind": "none"}),
            },
            "root": self.root.display().to_string(),
            "mode": self.mode.as_str(),
            "user": self.user.map(|ids| format!("{}:{}", ids.uid, ids.gid)),
            "network": network_json(&self.network),
            "limits": self.limits.to_json(),
            "env": {
                "set": self.env_set,
                "pass": self.env_pass,
                "secrets": self.env_secrets,
                "secretsAsEnv": self.env_secrets_as_env,
            },
            "security": self.security.plan_json(),
            "lifecycle": {"leaseMs": millis(self.lease)},
            "command": self.command,
            "description": self.description,
        });
        // Only units that name a runtime show one; the others' JSON is unchanged.
        if let Some(runtime) = &self.runtime {
            unit["runtime"] = json!(runtime);
        }
        // Likewise a unit the local backend may run on the host's userland.
        if self.local_userland != LocalUserland::default() {
            unit["localUserland"] = json!(self.local_userland.as_str());
        }
        // Likewise a pull policy other than the default ("missing").
        if self.pull != PullPolicy::default() {
            unit["pull"] = json!(self.pull.as_str());
        }
        // The variable's name only; its value is never policy.
        if let Some(name) = &self.pull_secret {
            unit["pullSecret"] = json!(name);
        }
        // Only units with volumes show them.
        if !self.volumes.is_empty() {
            unit["volumes"] = json!(
                self.volumes
                    .iter()
                    .map(super::Volume::plan_json)
                    .collect::<Vec<_>>()
            );
        }
        // Every other field of the unit's `[workspace]` or `[[server]]`, as
        // its row gives it (left out at its default where it is shown only when set).
        let written = self.written.as_ref().map(|written| match written {
            Written::Workspace(workspace) => (workspace.plan_json(), &UNIT_COMPLETED[..]),
            Written::Server(server) => (server.plan_json(), &SERVER_COMPLETED[..]),
        });
        if let (Value::Object(unit), Some((Value::Object(fields), completed))) =
            (&mut unit, written)
        {
            for (key, value) in fields {
                if !completed.contains(&key.as_str()) {
                    unit.insert(key, value);
                }
            }
        }
        unit
    }
}

/// The keys of `[[server]]`'s fields a unit's plan writes itself (above):
/// those of [`UNIT_COMPLETED`] a server has, and its own.
const SERVER_COMPLETED: [&str; 10] = [
    "name",
    "image",
    "pull",
    "pullSecret",
    "runtime",
    "localUserland",
    "command",
    "description",
    "network",
    "limits",
];

/// The keys of `[workspace]`'s fields a unit's plan writes itself (above),
/// resolved (`source`, `user`) or shared with a server's.
const UNIT_COMPLETED: [&str; 9] = [
    "image",
    "pull",
    "pullSecret",
    "root",
    "source",
    "mode",
    "user",
    "runtime",
    "localUserland",
];

fn network_json(network: &Network) -> Value {
    let mut shown = json!({"mode": network.mode.as_str(), "allow": network.allow});
    // Only egress units have these; other units' JSON stays as it was.
    if !network.hosts.is_empty() {
        shown["hosts"] = json!(network.hosts);
    }
    if network.private_destinations {
        shown["privateDestinations"] = json!(true);
    }
    if network.mode == NetworkMode::Egress {
        shown["maxConnections"] = json!(network.max_connections);
        shown["bytesPerSecond"] = json!(network.bytes_per_second);
    }
    // Every other field of `[network]`, as its row gives it (left out at its
    // default where it is shown only when set).
    if let (Value::Object(shown), Value::Object(written)) =
        (&mut shown, network.written.plan_json())
    {
        for (key, value) in written {
            if !COMPLETED.contains(&key.as_str()) {
                shown.insert(key, value);
            }
        }
    }
    shown
}

/// The keys of `[network]`'s fields the resolution completes (written above).
const COMPLETED: [&str; 5] = ["mode", "allow", "hosts", "maxConnections", "bytesPerSecond"];

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
