//! Every field of a profile, declared once per table: its name, its type and
//! default as `profiles/README.md` writes them, what a session's tightening
//! may do with it, and the key a plan (`box profile resolve --json`) hands it
//! to a unit under. Validation takes its unknown-field lists ("accepted
//! here: ...") from these tables, tightening what a session may name in
//! each table (in row order) and how each field is parsed and narrowed (its
//! row's rule), `box profile show` the limits it prints, and a test holds
//! the README's field tables to them.
//!
//! The limits are declared whole here ([`limits!`]): the profile's
//! `LimitsPolicy` and the plan's `Limits`, each limit's default, how it is
//! read, shown, asked for, narrowed and given to a unit all come from one row.
//! So are `[workspace]`, `[network]`, `[env]`, `[security]`, `[lifecycle]`,
//! `[pool]`, `[operator]`, `[[server]]` and `[[volume]]` ([`table!`]): each
//! table's struct, its defaults, reading it, `box profile show`'s fields and
//! a session's tightening of it (`plan/tighten/rules.rs`) come from one row
//! per field (a `[[server]]`'s `name`, `image` and `command` are required
//! rows, with no default), and so does the top level, whose `[[server]]`,
//! `[[volume]]` and `[operator]` are read after the tables they depend on
//! (`Servers[limits]`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::kinds::{After, Kind, Plain, Reads, Show, Shown, words};
use super::model::{Danger, ForkMode, OnPersisted, Secret, Source, UserChoice, defaults};
use super::tree::Node;
use super::validate::Allowance;
use super::validate::{
    Capabilities, Command, Devices, Environment, HostNamespaces, Image, Images, Lease, Network,
    Operator, Pass, PoolSize, Privileged, PullSecret, Root, Runtime, ServerContext, ServerName,
    Servers, SessionLimits, UnitLimits, VolumeAt, VolumeContext, VolumeName, Volumes, Walk, join,
};
use super::value::{ByteSize, CpuQuota};
use crate::allow::Rule;
use crate::image::PullPolicy;
use crate::plan::{
    LocalUserland, MountMode, NetworkMode, Requirement, TmpMode, VolumePath, VolumeScope,
};

/// What a session's tightening (`box.tighten`) may do with a field: in a
/// `table!` row, the rule it is parsed and narrowed by (`plan/tighten/rules.rs`,
/// each a type of the same name), unless the row names a narrower of its
/// own after it (`Among(ImageChoice)`, `plan/tighten/special.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tighten {
    /// Nothing: it is the profile's (a profile that extends this one can set
    /// it); a session that asks is told it cannot tighten it.
    No,
    /// At most the profile's value, in the field's narrowing order (a
    /// choice's declaration order, sizes, durations, counts, `false` < `true`).
    AtMost,
    /// One of the profile's choices, or a subset of its list.
    Among,
    /// Entries removed by name: at the top level a list of tables a session
    /// keeps some of by its plural (`servers`, `volumes`); in a table, a field
    /// whose entries the table's `drop` removes (`env.drop`).
    Drop,
    /// A table a session narrows field by field.
    Within,
}

/// One field of a profile table.
#[derive(Debug)]
// Beyond the name, read by the README's check (`profile/tests.rs`).
#[cfg_attr(not(test), expect(dead_code))]
pub(crate) struct Field {
    /// Its key in the table.
    pub(crate) name: &'static str,
    /// Its type, as the README's type column writes it; a table of its own
    /// is written as its heading (`` `[workspace]` ``).
    pub(crate) kind: &'static str,
    /// Its default, as the README's default column writes it.
    pub(crate) default: &'static str,
    /// What a session may do with it.
    pub(crate) tighten: Tighten,
    /// The key a plan gives a unit it under (`box profile resolve --json`),
    /// the name the envelope reports what was applied under; `None`: it does
    /// not reach a unit as itself.
    pub(crate) envelope: Option<&'static str>,
}

/// A profile table: where it is, and its fields in the order a profile's
/// errors list them.
#[derive(Debug)]
#[cfg_attr(not(test), expect(dead_code))]
pub(crate) struct Table {
    /// Its path in a profile (`""` for the top level, `env.secrets`).
    pub(crate) path: &'static str,
    /// The README's section (`### ` and this) and which field table in it (from 1).
    pub(crate) readme: (&'static str, usize),
    /// Its fields.
    pub(crate) fields: &'static [Field],
}

impl Table {
    /// Its field names, in order: the "accepted here" list.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.fields.iter().map(|field| field.name).collect()
    }
}

const fn field(
    name: &'static str,
    kind: &'static str,
    default: &'static str,
    tighten: Tighten,
    envelope: Option<&'static str>,
) -> Field {
    Field {
        name,
        kind,
        default,
        tighten,
        envelope,
    }
}

use Tighten::{Among, AtMost, Drop, No, Within};

/// A field's key in its table: the struct field's name, or the one written
/// in parentheses after it (`neutralise_git("git")`).
macro_rules! field_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $name:literal) => {
        $name
    };
}

/// A field's plan and envelope key, under the prefix its table names
/// (`plan "security."`: `security.readOnlyRoot`; `plan ""`: a unit's `image`).
macro_rules! envelope_key {
    ($plan:literal ;) => {
        None
    };
    ($plan:literal ; $key:literal) => {
        Some(concat!($plan, $key))
    };
}

/// Where `box profile show` places a field: on its table's line unless its row says.
macro_rules! show {
    () => {
        Show::Line
    };
    ($show:ident) => {
        Show::$show
    };
}

/// What a table is read within: its header's `with` type, else nothing.
macro_rules! context {
    () => {
        ()
    };
    ($context:ty) => {
        $context
    };
}

/// A field its table does not write: its default, or (a required field) a
/// problem at the table naming it.
macro_rules! absent {
    ($walk:ident, $node:ident, $path:ident; = $default:expr) => {
        Some($default)
    };
    ($walk:ident, $node:ident, $path:ident; , required $message:literal) => {{
        $walk.problem($node, $path, $message.to_owned());
        None
    }};
}

/// One field of the table `node` at `path`: by its reader within the
/// table's context (absent: its default, or a problem when it is required),
/// or by its reader after the fields its row names (`Servers[limits]`).
macro_rules! read_field {
    ([], $ty:ty, $reads:ty, $walk:ident, $node:ident, $path:ident, $context:ident, $fields:ident, $name:expr, ($($absent:tt)*)) => {
        match $fields.get($name) {
            Some(found) => {
                let field = join($path, $name);
                <$reads as Reads<$ty, Context>>::read_in($walk, found, &field, $context)
            }
            None => <$reads as Reads<$ty, Context>>::absent($context)
                .or_else(|| absent!($walk, $node, $path; $($absent)*)),
        }
    };
    ([$($after:ident),+], $ty:ty, $reads:ty, $walk:ident, $node:ident, $path:ident, $context:ident, $fields:ident, $name:expr, ($($absent:tt)*)) => {
        <$reads as After<$ty, _>>::read_after($walk, $fields.get($name), &join($path, $name), ($(&$after,)+))
    };
}

/// A field into a plan's JSON under its key, when `given` (a field with no
/// plan key reaches no unit as itself).
macro_rules! plan_field {
    ($plan:ident, $ty:ty, $value:expr, $given:expr) => {};
    ($plan:ident, $ty:ty, $value:expr, $given:expr, $key:literal) => {
        if $given {
            $plan.insert($key.to_owned(), <$ty as Kind>::plan($value));
        }
    };
}

/// Whether a field is its default (a required field has none).
macro_rules! is_default {
    ($ty:ty; $value:expr) => {
        false
    };
    ($ty:ty; $value:expr, $default:expr) => {{
        let default: $ty = $default;
        $value == default
    }};
}

/// A table whose every field has a default: `defaults()`, and reading it
/// where it may be absent (every default). Nothing for a table with a
/// required field (each `[[server]]` is read where it is written).
macro_rules! table_defaults {
    ($($field:ident = $default:expr),*) => {
        /// Every field's default: the strict ones.
        pub(crate) fn defaults() -> Self {
            Self { $( $field: $default, )* }
        }

        /// The table at `path` (absent: every default), a problem for
        /// each unknown field and each value that is not its field's.
        pub(super) fn read(walk: &mut Walk, node: Option<&Node>, path: &str) -> Option<Self> {
            match node {
                Some(node) => Self::read_in(walk, node, path, &()),
                None => Some(Self::defaults()),
            }
        }
    };
    ($($field:ident $(= $default:expr)?),*) => {};
}

/// A table with a required field: `new`, taking the required fields in row
/// order and giving every other its default, so code that makes one (tests,
/// mostly) names only what it sets and a new defaulted row changes none of it.
/// Nothing for a table whose every field has a default (`defaults()`).
macro_rules! table_new {
    (@rows [$($param:ident: $param_ty:ty,)*] [$($init:tt)*]) => {
        /// The table with its required fields as given (in row order) and
        /// every other field at its default.
        pub fn new($($param: $param_ty),*) -> Self {
            Self { $($init)* }
        }
    };
    (@rows [$($params:tt)*] [$($init:tt)*] $field:ident: $ty:ty = $default:expr $(, $($rest:tt)*)?) => {
        table_new!(@rows [$($params)*] [$($init)* $field: $default,] $($($rest)*)?);
    };
    (@rows [$($params:tt)*] [$($init:tt)*] $field:ident: $ty:ty $(, $($rest:tt)*)?) => {
        table_new!(@rows [$($params)* $field: $ty,] [$($init)* $field,] $($($rest)*)?);
    };
    ($($field:ident: $ty:ty = $default:expr),*) => {};
    ($($rows:tt)*) => {
        table_new!(@rows [] [] $($rows)*);
    };
}

/// A table whose every field has a default is a field's type too (the top
/// level's `workspace`, ...): read as its table, written as its fields.
macro_rules! table_kind {
    ($Struct:ident; $($field:ident = $default:expr),*) => {
        impl Kind for $Struct {
            fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
                Self::read(walk, Some(node), field)
            }

            fn text(&self) -> String {
                let shown: Vec<String> = self.shown().iter().map(Shown::pair).collect();
                shown.join(", ")
            }

            /// Its fields but those shown only when set and not.
            fn word(&self) -> serde_json::Value {
                serde_json::Value::Object(
                    self.shown()
                        .into_iter()
                        .filter(|field| field.show != Show::IfSet || !field.default)
                        .map(|field| (field.name.to_owned(), field.json))
                        .collect(),
                )
            }

            fn plan(&self) -> serde_json::Value {
                self.plan_json()
            }
        }
    };
    ($Struct:ident; $($field:ident $(= $default:expr)?),*) => {};
}

/// A table's tightening (`Tightened`), unless its header says `[untightened]`
/// (the top level, whose rows `plan/tighten.rs` reads itself).
macro_rules! tightened {
    ([] $($tightened:tt)*) => { $($tightened)* };
    ([untightened] $($tightened:tt)*) => {};
}

/// How a session narrows a field: by its row's rule (`AtMost`: the rule's
/// type in `plan/tighten/rules.rs`), or by the narrower its row names after
/// the rule where the narrowing depends on another field (`Among(ImageChoice)`).
macro_rules! narrows {
    ($tighten:ident) => {
        $crate::plan::tighten::rule::$tighten
    };
    ($tighten:ident $narrows:ident) => {
        $crate::plan::tighten::$narrows
    };
}

/// Declares a profile table from one row per field: the struct a profile
/// holds it in (each field's type, documentation and default), its `Table`
/// (the README's type and default, what a session may do with it, its plan
/// and envelope key), reading it (by its type, or by its reader where that
/// is special: a danger, a check beyond the type), `box profile show`'s
/// fields (`shown`), the plan's JSON (`plan_json`, under the keys) and a
/// session's tightening of it (`Tightened`: each field parsed and narrowed
/// by its rule, or by the narrower its row names after the rule):
/// `/// doc` `field("name")?: Type = default => Reader, Tighten(Narrower)?, (Show,)? "README type", "README default"(, "planKey")?;`
/// A field with no default is `field: Type, required "what to write" => ...`:
/// its absence is a problem at its table saying what to write, and the table
/// gets `new`, taking its required fields (every other at its default). A table read
/// within a context (`with Type` after its plan prefix: what its readers
/// that depend on other fields see) is read by `read_in` only.
macro_rules! table {
    (
        $(#[doc = $table_doc:literal])*
        $TABLE:ident = $path:literal, $readme:expr, plan $plan:literal $(, with $Context:ty)? $([$untightened:ident])?;
        $(#[$meta:meta])*
        $vis:vis struct $Struct:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident $(($name:literal))?: $ty:ty $(= $default:expr)? $(, required $required:literal)?
                    => $reads:ty $([$($after:ident),+])?, $tighten:ident $(($narrows:ident))?, $($show:ident,)? $readme_kind:literal, $readme_default:literal
                    $(, $key:literal)?;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $Struct {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl $Struct {
            table_defaults!($( $field $(= $default)? ),*);
            table_new!($( $field: $ty $(= $default)? ),*);

            /// The table `node` at `path` within `context`, a problem for
            /// each unknown field, each value that is not its field's and
            /// each required field not written.
            pub(super) fn read_in(
                walk: &mut Walk,
                node: &Node,
                path: &str,
                context: &context!($($Context)?),
            ) -> Option<Self> {
                type Context = context!($($Context)?);
                let fields = walk.table(node, path, &$TABLE.names());
                $(
                    let $field: Option<$ty> = read_field!(
                        [$($($after),+)?], $ty, $reads, walk, node, path, context, fields,
                        field_name!($field $(, $name)?), ($(= $default)? $(, required $required)?)
                    );
                )*
                Some(Self { $( $field: $field?, )* })
            }

            /// Every field as `box profile show` writes it, in order.
            #[allow(dead_code, reason = "a table box profile show does not write")]
            pub fn shown(&self) -> Vec<Shown> {
                type Context = context!($($Context)?);
                vec![$(
                    Shown {
                        name: field_name!($field $(, $name)?),
                        text: <$reads as Reads<$ty, Context>>::text(&self.$field),
                        list: <$ty as Kind>::LIST,
                        json: <$reads as Reads<$ty, Context>>::word(&self.$field),
                        show: show!($($show)?),
                        default: is_default!($ty; self.$field $(, $default)?),
                    },
                )*]
            }

            /// The fields a plan gives a unit, under their keys: `{"readOnlyRoot": true, ...}`;
            /// a field shown only when set (`IfSet`) is left out at its default.
            #[allow(dead_code, reason = "a table whose fields reach a unit another way")]
            pub(crate) fn plan_json(&self) -> serde_json::Value {
                #[allow(unused_mut, reason = "a table with no plan key")]
                let mut plan = serde_json::Map::new();
                $(
                    plan_field!(
                        plan, $ty, &self.$field,
                        show!($($show)?) != Show::IfSet || !is_default!($ty; self.$field $(, $default)?)
                        $(, $key)?
                    );
                )*
                serde_json::Value::Object(plan)
            }
        }

        table_kind!($Struct; $( $field $(= $default)? ),*);

tightened! { [$($untightened)?]
        impl $crate::plan::tighten::Tightened for $Struct {
            const TABLE: &'static Table = &$TABLE;

            fn ask(name: &str, value: &serde_json::Value) -> Result<(), $crate::plan::PlanError> {
                use $crate::plan::tighten::Narrows;
                $(
                    if name == field_name!($field $(, $name)?) {
                        <narrows!($tighten $($narrows)?) as Narrows<$ty, Self>>::parse(value, &join($path, name))?;
                    }
                )*
                Ok(())
            }

            fn narrow(
                &self,
                asked: &$crate::plan::tighten::Asked,
                profile: &str,
            ) -> Result<Self, $crate::plan::PlanError> {
                use $crate::plan::tighten::{Narrowing, Narrows};
                let mut narrowed = self.clone();
                $({
                    type Narrower = narrows!($tighten $($narrows)?);
                    let name = field_name!($field $(, $name)?);
                    let field = join($path, name);
                    let asked_value = asked
                        .get(name)
                        .map(|value| <Narrower as Narrows<$ty, Self>>::parse(value, &field))
                        .transpose()?;
                    let current = narrowed.$field.clone();
                    narrowed.$field = <Narrower as Narrows<$ty, Self>>::narrow(Narrowing {
                        asked: asked_value,
                        current,
                        bound: self,
                        narrowed: &mut narrowed,
                        field: &field,
                        profile,
                    })?;
                    for dropped in &asked.drop {
                        <Narrower as Narrows<$ty, Self>>::drop_named(&mut narrowed.$field, dropped);
                    }
                })*
                Ok(narrowed)
            }
        }
        }

        $(#[doc = $table_doc])*
        pub(crate) const $TABLE: Table = Table {
            path: $path,
            readme: $readme,
            fields: &[$(
                field(
                    field_name!($field $(, $name)?),
                    $readme_kind,
                    $readme_default,
                    $tighten,
                    envelope_key!($plan ; $($key)?),
                ),
            )*],
        };
    };
}

#[rustfmt::skip]
table! {
    /// The top level.
    TOP = "", ("Top level", 1), plan "" [untightened];
    /// A profile's top level as written: its description and its tables,
    /// each read by its own rows (`validate` makes it a `Profile`).
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct TopLevel {
        /// One line about what it is for.
        description: String = String::new() => Plain, No, "string", r#"`""`"#, "description";
        /// The profile it extends (followed by the loader; a string here).
        extends: String = String::new() => Plain, No, "string", "none";
        /// The workspace unit.
        workspace: Workspace = Workspace::defaults() => Plain, Within, "`[workspace]`", "";
        /// The workspace unit's network.
        network: NetworkPolicy = NetworkPolicy::defaults() => Network, Within, "`[network]`", "", "network";
        /// The workspace unit's limits (servers' are over them).
        limits: LimitsPolicy = LimitsPolicy::defaults() => SessionLimits, Within, "`[limits]`", "", "limits";
        /// The workspace unit's environment.
        env: EnvPolicy = EnvPolicy::defaults() => Environment, Within, "`[env]`", "", "env";
        /// The hardening of every unit.
        security: Security = Security::defaults() => Plain, No, "`[security]`", "", "security";
        /// Every unit's lifecycle.
        lifecycle: LifecyclePolicy = LifecyclePolicy::defaults() => Plain, No, "`[lifecycle]`", "", "lifecycle";
        /// The warm units a listening host keeps.
        pool: PoolPolicy = PoolPolicy::defaults() => Plain, No, "`[pool]`", "";
        /// Server units, in the order written, their limits over `limits`.
        servers("server"): Vec<Server> = Vec::new() => Servers[limits], Drop, "`[[server]]`", "";
        /// The workspace unit's volumes, beside its root.
        volumes("volume"): Vec<Volume> = Vec::new() => Volumes[workspace], Drop, "`[[volume]]`", "", "volumes";
        /// The dangerous asks of the tables above, each allowed by name in
        /// `[operator]` (an allowance not used is a problem there).
        dangerous("operator"): Vec<Danger> = Vec::new() => Operator[workspace, network, servers], No, "`[operator]`", "";
    }
}

#[rustfmt::skip]
table! {
    /// `[workspace]`.
    WORKSPACE = "workspace", ("`[workspace]`", 1), plan "";
    /// The workspace unit as written.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Workspace {
        /// The image it runs.
        image: String = defaults::IMAGE.to_owned() => Image, Among(ImageChoice), "string", r#"`"box-base:bookworm"`"#, "image";
        /// Other images a session may choose with `tighten.workspace.image`
        /// (`image` is always one it may choose).
        images: Vec<String> = Vec::new() => Images, No, IfSet, "array of image references", "`[]`";
        /// When the image is pulled from its registry.
        pull: PullPolicy = PullPolicy::Missing => Plain, No, IfSet, r#"`"never"` \| `"missing"` \| `"always"`"#, r#"`"missing"`"#, "pull";
        /// The host variable holding `user:password` for the image's registry
        /// (`pull_secret`): given to the engine for pulls, never to the unit.
        pull_secret: Option<String> = None => PullSecret, No, IfSet, "string", "none", "pullSecret";
        /// Where the workspace appears inside the unit.
        root: PathBuf = PathBuf::from(defaults::ROOT) => Root, No, "absolute path", r#"`"/workspace"`"#, "root";
        /// Where the workspace comes from.
        source: Source = Source::Cwd => Plain, No, r#"`"cwd"` \| `"fork"` \| `"empty"` \| `"none"` \| absolute host path"#, r#"`"cwd"`"#, "source";
        /// Read-only or read-write.
        mode: MountMode = MountMode::ReadWrite => Plain, AtMost, r#"`"rw"` \| `"ro"`"#, r#"`"rw"`"#, "mode";
        /// Who processes run as.
        user: UserChoice = UserChoice::Host => Plain, No, r#"`"host"` \| `"image"` \| `"UID:GID"`"#, r#"`"host"`"#, "user";
        /// The engine's OCI runtime for this unit (`runsc` for gVisor); `None`: the
        /// engine's default.
        runtime: Option<String> = None => Runtime, No, IfSet, "runtime name", "the engine's default (`runc`)", "runtime";
        /// Whether the local backend may run this unit on the host's userland in
        /// place of `image`. Goes with `image`: a profile that sets `image`
        /// without it does not inherit its parent's.
        local_userland: LocalUserland = LocalUserland::Refuse => Plain, AtMost, IfSet, r#"`"refuse"` \| `"host"`"#, r#"`"refuse"`"#, "localUserland";
        // The plan's, not a unit's: `onPersistedCredentials` and `workspaceFork`.
        /// What a credential persisted in the workspace at session start does.
        on_persisted_credentials: OnPersisted = OnPersisted::Report => Plain, No, r#"`"report"` \| `"refuse"` \| `"hide"`"#, r#"`"report"`"#;
        /// With `source = "fork"`: how each session's fork is made.
        fork_mode: ForkMode = ForkMode::Auto => Plain, No, IfSet, r#"`"auto"` \| `"worktree"` \| `"copy"`"#, r#"`"auto"`"#;
    }
}

#[rustfmt::skip]
table! {
    /// `[network]`, and a server's `network`.
    NETWORK = "network", ("`[network]`", 1), plan "network.";
    /// A unit's network as written (declared in `fields.rs`, one row per
    /// field; each is checked against the mode once read).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct NetworkPolicy {
        /// How much network.
        mode: NetworkMode = NetworkMode::None => Plain, AtMost, r#"`"none"` \| `"egress"` \| `"bridge"`"#, r#"`"none"`"#, "mode";
        /// For `egress`: what may be reached (empty otherwise).
        allow: Vec<Rule> = Vec::new() => Plain, Among(AllowWithin), "array of `host[:port]`", "`[]`", "allow";
        /// For `egress`: names pinned to addresses, resolved by the host's proxy before
        /// its resolver (like `--add-host`): registries on a private network, tests.
        hosts: BTreeMap<String, IpAddr> = BTreeMap::new() => Plain, No, IfSet, "table of name = IP address", "`{}`", "hosts";
        /// For `egress`: connections open at once through the unit's proxy.
        max_connections: Option<u64> = None => Plain, No, IfSet, "whole number", "`256` with `egress`", "maxConnections";
        /// For `egress`: bytes per second through the unit's proxy, each direction.
        bandwidth: Option<ByteSize> = None => Plain, No, IfSet, r#"size per second (`"10MiB"`)"#, "no cap", "bytesPerSecond";
    }
}

#[rustfmt::skip]
table! {
    /// `[env]`.
    ENV = "env", ("`[env]`", 1), plan "env.";
    /// The environment as written (declared in `fields.rs`, one row per field).
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    pub struct EnvPolicy {
        /// Variables set in the unit.
        set: BTreeMap<String, String> = BTreeMap::new() => Plain, Drop, r#"table of `NAME = "value"`"#, "`{}`", "set";
        /// Host variables handed through by name (never a credential).
        pass: Vec<String> = Vec::new() => Pass, Drop, "array of names", "`[]`", "pass";
        /// Host variables that are credentials, handed through because named here
        /// (as files under `/run/secrets`, never the unit's environment), each
        /// saying whether it is also a variable of the processes the executor starts.
        secrets: Vec<Secret> = Vec::new() => Plain, Drop, "array of names or `{name, as_env}` tables", "`[]`", "secrets";
    }
}

/// A table entry of `env.secrets`.
#[rustfmt::skip]
pub(crate) const SECRET: Table = Table {
    path: "env.secrets",
    readme: ("`[env]`", 2),
    fields: &[
        field("name", "name", "required", No, None),
        field("as_env", "boolean", "`false`", No, Some("env.secretsAsEnv")),
    ],
};

words!(
    /// `security.git`: `"neutralise"` or `"off"`.
    Git: bool = ["neutralise" = true, "off" = false]
);
words!(
    /// `security.write_guard`: `"read-first"` or `"off"`.
    WriteGuard: bool = ["read-first" = true, "off" = false]
);

#[rustfmt::skip]
table! {
    /// `[security]`.
    SECURITY = "security", ("`[security]`", 1), plan "security.";
    /// The hardening a unit must get: the profile's `[security]`, which
    /// every unit gets as the profile says (declared in box-policy's
    /// `profile/fields.rs`, one row per field).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Security {
        /// Capabilities added back after dropping all (a short reviewed list).
        capabilities: Vec<String> = Vec::new() => Capabilities, No, Line, "array of names", "`[]`", "capabilities";
        /// Read-only root file system.
        read_only_root: bool = true => Plain, No, Line, "bool", "`true`", "readOnlyRoot";
        /// Landlock for the executor and its children.
        landlock: Requirement = Requirement::Required => Plain, No, Line, r#"`"required"` \| `"best-effort"` \| `"off"`"#, r#"`"required"`"#, "landlock";
        /// Whether git configuration is neutralised for children.
        neutralise_git("git"): bool = true => Git, No, Line, r#"`"neutralise"` \| `"off"`"#, r#"`"neutralise"`"#, "neutraliseGit";
        /// Whether overwriting an existing file needs an earlier read of it.
        write_guard: bool = true => WriteGuard, No, Line, r#"`"read-first"` \| `"off"`"#, r#"`"read-first"`"#, "writeGuard";
        /// Whether programs may run from `/tmp`.
        tmp: TmpMode = TmpMode::Exec => Plain, No, Line, r#"`"exec"` \| `"noexec"`"#, r#"`"exec"`"#, "tmp";
        /// A privileged unit (only when the profile's operator allowed it).
        privileged: bool = false => Privileged, No, Danger, "bool", "`false`", "privileged";
        /// Host namespaces shared (only when the profile's operator allowed it).
        host_namespaces: Vec<String> = Vec::new() => HostNamespaces, No, Danger, "array of `cgroup`, `ipc`, `net`, `pid`, `user`, `uts`", "`[]`", "hostNamespaces";
        /// Host devices handed in (only when the profile's operator allowed it).
        devices: Vec<PathBuf> = Vec::new() => Devices, No, Danger, "array of paths under `/dev`", "`[]`", "devices";
    }
}

#[rustfmt::skip]
table! {
    /// `[lifecycle]`.
    LIFECYCLE = "lifecycle", ("`[lifecycle]`", 1), plan "lifecycle.";
    /// Every unit's lifecycle as written.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct LifecyclePolicy {
        /// How long a unit outlives its host's last renewal: box's init in the
        /// unit ends it when its host has not renewed for this long (the host
        /// died, hung or was stopped).
        lease: Duration = defaults::LEASE => Lease, No, Line, "duration, `1s` to `1h`", "`\"30s\"`", "leaseMs";
    }
}

#[rustfmt::skip]
table! {
    /// `[pool]`: the warm units a `box serve --listen` host keeps for the
    /// profile's sessions; the host's, never a session's (`box serve --pool`
    /// overrides it).
    POOL = "pool", ("`[pool]`", 1), plan "pool.";
    /// `[pool]`: how many units of the profile's workspace a listening host
    /// keeps started with no session, for its sessions to claim.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct PoolPolicy {
        /// Units kept ready; 0: none (every session starts cold).
        size: usize = 0 => PoolSize, No, Line, "whole number, `0` to `256`", "`0` (no pool)";
    }
}

/// The type of a server's `network` and `limits`: a table of the fields
/// `[network]` declares and of each unit's limits, which the README's type
/// column lists (`` `{ mode, allow, ... }` ``; its check writes the list
/// from those tables, so a field added there is not declared twice).
#[cfg(test)]
pub(crate) const FIELDS_OF: &str = "a table of its section's fields";

#[rustfmt::skip]
table! {
    /// A `[[server]]` table.
    SERVER = "server", ("`[[server]]`", 1), plan "", with ServerContext;
    /// A server unit as written: runs one MCP server offered to the session
    /// (declared in `fields.rs`, one row per field).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Server {
        /// Its name within the session.
        name: String, required "a server needs a name, like name = \"fetch\"" => ServerName, Drop, "string", "required", "name";
        /// The image.
        image: String, required "a server needs an image, like image = \"box-fetch:latest\"" => Image, No, "string", "required", "image";
        /// When the image is pulled from its registry.
        pull: PullPolicy = PullPolicy::Missing => Plain, No, r#"`"never"` \| `"missing"` \| `"always"`"#, r#"`"missing"`"#, "pull";
        /// The host variable holding `user:password` for the image's registry.
        pull_secret: Option<String> = None => PullSecret, No, "string", "none", "pullSecret";
        /// The engine's OCI runtime for this unit; `None`: the engine's default.
        runtime: Option<String> = None => Runtime, No, "runtime name", "the engine's default", "runtime";
        /// Whether the local backend may run this unit on the host's userland.
        local_userland: LocalUserland = LocalUserland::Refuse => Plain, No, r#"`"refuse"` \| `"host"`"#, r#"`"refuse"`"#, "localUserland";
        /// The MCP server command (stdio).
        command: Vec<String>, required "a server needs a command, like command = [\"mcp-server\", \"--stdio\"]" => Command, No, "array of strings", "required", "command";
        /// One line about what it offers.
        description: String = String::new() => Plain, No, "string", r#"`""`"#, "description";
        /// Its network (default: none). Its README type is `FIELDS_OF`.
        network: NetworkPolicy = NetworkPolicy::defaults() => Network, No, "a table of its section's fields", r#"`{ mode = "none" }`"#, "network";
        /// Its limits (default: the profile's). Its README type is `FIELDS_OF`.
        limits: LimitsPolicy = LimitsPolicy::defaults() => UnitLimits, No, "a table of its section's fields", "the profile's `[limits]`", "limits";
    }
}

#[rustfmt::skip]
table! {
    /// A `[[volume]]` table.
    VOLUME = "volume", ("`[[volume]]`", 1), plan "volumes.", with VolumeContext;
    /// A volume: storage that outlives a unit (`[[volume]]`; declared in
    /// box-policy's `profile/fields.rs`, one row per field).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Volume {
        /// Its name within the profile.
        name: String, required "a volume needs a name, like name = \"pip-cache\"" => VolumeName, Drop, "string", "required", "name";
        /// Where it appears in the unit.
        path: VolumePath, required "a volume needs a path in the unit, like path = \"~/.cache/pip\"" => VolumeAt, No, r#"`"~/REL"` \| absolute path"#, "required", "path";
        /// Who shares it and how long it lives.
        scope: VolumeScope = VolumeScope::Session => Plain, No, r#"`"session"` \| `"profile"`"#, r#"`"session"`"#, "scope";
    }
}

#[rustfmt::skip]
table! {
    /// `[operator]`.
    OPERATOR = "operator", ("`[operator]`", 1), plan "";
    /// `[operator]` as written: what its operator allows the profile.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct OperatorPolicy {
        /// The dangerous asks allowed, each by name, where it was written
        /// (an allowance the profile does not use is a problem there).
        allow_dangerous: Vec<Allowance> = Vec::new() => Plain, No, "array of the names above", "`[]`";
    }
}

/// Every table, for the README's check.
#[cfg(test)]
pub(crate) const TABLES: [&Table; 12] = [
    &TOP, &WORKSPACE, &NETWORK, &LIMITS, &ENV, &SECRET, &SECURITY, &LIFECYCLE, &POOL, &SERVER,
    &VOLUME, &OPERATOR,
];

/// A limit's value, of one of four kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LimitValue {
    /// A size (`"2GiB"`).
    Size(ByteSize),
    /// Cores (`2`, `0.5`).
    Cpus(CpuQuota),
    /// A whole number from 1.
    Count(u64),
    /// A duration (`"10m"`).
    Duration(Duration),
}

impl LimitValue {
    /// As `box profile show` and a refused tightening write it.
    pub(crate) fn text(self) -> String {
        match self {
            LimitValue::Size(size) => size.to_string(),
            LimitValue::Cpus(cpus) => cpus.to_string(),
            LimitValue::Count(count) => count.to_string(),
            LimitValue::Duration(duration) => super::value::show_duration(duration),
        }
    }

    /// As `box profile show --json` writes it: cores and counts as numbers.
    pub(crate) fn json(self) -> serde_json::Value {
        match self {
            LimitValue::Cpus(cpus) => serde_json::json!(cpus.cores()),
            LimitValue::Count(count) => serde_json::json!(count),
            LimitValue::Size(_) | LimitValue::Duration(_) => serde_json::json!(self.text()),
        }
    }
}

/// Which of the four kinds a limit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitKind {
    /// A size.
    Size,
    /// Cores.
    Cpus,
    /// A whole number.
    Count,
    /// A duration.
    Duration,
}

/// Whose a limit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Each unit's: a server's `limits` may set its own.
    Unit,
    /// The session's (idle, lifetime, the start deadline): every unit shares
    /// the profile's `[limits]` value, and a tightening of it narrows every unit.
    Session,
}

/// One limit: its field, kind and scope, and how it is read from and written
/// into a [`LimitsPolicy`].
#[derive(Debug)]
pub(crate) struct Limit {
    /// The field.
    pub(crate) field: Field,
    /// Its kind.
    pub(crate) kind: LimitKind,
    /// Whose it is.
    pub(crate) scope: Scope,
    /// Its value in `limits`.
    pub(crate) get: fn(&LimitsPolicy) -> LimitValue,
    /// Set it in `limits` (a value of its kind).
    pub(crate) set: fn(&mut LimitsPolicy, LimitValue),
}

/// A limit's type in a plan (`plan::Limits`), by its kind: sizes in bytes,
/// cores as a fraction, durations as they are.
macro_rules! plan_type {
    (Size) => {
        u64
    };
    (Cpus) => {
        f64
    };
    (Count) => {
        u64
    };
    (Duration) => {
        Duration
    };
}

/// What a plan's limit is in, by its kind (a line of its documentation).
macro_rules! plan_unit {
    (Size) => {
        "In bytes."
    };
    (Cpus) => {
        "As a fraction of cores."
    };
    (Count) => {
        "A whole number."
    };
    (Duration) => {
        "A duration."
    };
}

/// A limit's value in a plan, by its kind.
macro_rules! plan_value {
    (Size, $value:expr) => {
        $value.0
    };
    (Cpus, $value:expr) => {
        $value.cores()
    };
    (Count, $value:expr) => {
        $value
    };
    (Duration, $value:expr) => {
        $value
    };
}

/// A plan's limit as JSON (`box profile resolve --json`), by its kind:
/// numbers, durations in milliseconds.
macro_rules! plan_json {
    (Duration, $value:expr) => {
        serde_json::json!(u64::try_from($value.as_millis()).unwrap_or(u64::MAX))
    };
    ($kind:ident, $value:expr) => {
        serde_json::json!($value)
    };
}

/// Declares every limit from one row each: the profile's `LimitsPolicy` and
/// the plan's `Limits` (`plan_field`, the plan JSON's and the envelope's
/// `key`), the default, whose it is, the README's type and default, and its
/// row in `LIMIT_FIELDS`, from which it is read, shown, asked for and narrowed:
/// `/// doc` `name: Type as Kind = default, Scope, "README type", "README default", plan_field "key";`
macro_rules! limits {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty as $kind:ident = $default:expr, $scope:ident,
            $readme_kind:literal, $readme_default:literal, $plan:ident $key:literal;
    )*) => {
        /// A unit's limits as written (declared in `fields.rs`, one row per limit).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct LimitsPolicy {
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl LimitsPolicy {
            /// Every limit's default: the strict ones.
            pub(crate) fn defaults() -> Self {
                Self { $( $name: $default, )* }
            }

            /// The limits in a plan.
            pub(crate) fn plan(&self) -> Limits {
                Limits { $( $plan: plan_value!($kind, self.$name), )* }
            }
        }

        /// A unit's limits in a plan, in plain numbers (declared in
        /// box-policy's `profile/fields.rs`, one row per limit).
        #[derive(Debug, Clone, PartialEq)]
        pub struct Limits {
            $( $(#[doc = $doc])* #[doc = ""] #[doc = plan_unit!($kind)] pub $plan: plan_type!($kind), )*
        }

        /// The shipped `default` profile's limits.
        impl Default for Limits {
            fn default() -> Self {
                LimitsPolicy::defaults().plan()
            }
        }

        impl Limits {
            /// Whether every limit of `self` is at most `bound`'s.
            pub fn is_within(&self, bound: &Limits) -> bool {
                true $( && self.$plan <= bound.$plan )*
            }

            /// As a plan's JSON gives them: `{"memoryBytes": ..., "callTimeoutMs": ...}`.
            pub(crate) fn to_json(&self) -> serde_json::Value {
                serde_json::json!({ $( $key: plan_json!($kind, self.$plan), )* })
            }
        }

        /// `[limits]`, one row per limit.
        pub(crate) const LIMIT_FIELDS: &[Limit] = &[$(
            Limit {
                field: field(stringify!($name), $readme_kind, $readme_default, AtMost, Some(concat!("limits.", $key))),
                kind: LimitKind::$kind,
                scope: Scope::$scope,
                get: |limits| LimitValue::$kind(limits.$name),
                set: |limits, value| {
                    if let LimitValue::$kind(value) = value {
                        limits.$name = value;
                    }
                },
            },
        )*];

        /// `[limits]` as a table.
        pub(crate) const LIMITS: Table = Table {
            path: "limits",
            readme: ("`[limits]`", 1),
            fields: &[$(
                field(stringify!($name), $readme_kind, $readme_default, AtMost, Some(concat!("limits.", $key))),
            )*],
        };
    };
}

#[rustfmt::skip]
limits! {
    /// Memory (swap off).
    memory: ByteSize as Size = ByteSize(2 << 30), Unit, "size", r#"`"2GiB"`"#, memory_bytes "memoryBytes";
    /// CPUs, in cores.
    cpus: CpuQuota as Cpus = CpuQuota(2000), Unit, "number", "`2.0`", cpus "cpus";
    /// Most processes and threads.
    pids: u64 as Count = 512, Unit, "integer", "`512`", pids "pids";
    /// Size of the /tmp tmpfs.
    tmp: ByteSize as Size = ByteSize(256 << 20), Unit, "size", r#"`"256MiB"`"#, tmp_bytes "tmpBytes";
    /// Size of the unit's home (a tmpfs holding what the image put there).
    home: ByteSize as Size = ByteSize(512 << 20), Unit, "size", r#"`"512MiB"`"#, home_bytes "homeBytes";
    /// Most open files per process.
    nofile: u64 as Count = 4096, Unit, "integer", "`4096`", nofile "nofile";
    /// Deadline of one call.
    call_timeout: Duration as Duration = Duration::from_secs(600), Unit, "duration", r#"`"10m"`"#, call_timeout "callTimeoutMs";
    /// No request for this long ends the session.
    idle: Duration as Duration = Duration::from_secs(1800), Session, "duration", r#"`"30m"`"#, idle "idleMs";
    /// The session ends after this long whatever happens.
    lifetime: Duration as Duration = Duration::from_secs(8 * 3600), Session, "duration", r#"`"8h"`"#, lifetime "lifetimeMs";
    /// Starting the session's units (engine and executor) must end within this.
    start_timeout: Duration as Duration = Duration::from_secs(60), Session, "duration", r#"`"1m"`"#, start_timeout "startTimeoutMs";
}

impl Limit {
    /// The limits each unit has of its own (a server's `limits` may set them).
    pub(crate) fn unit_names() -> Vec<&'static str> {
        LIMIT_FIELDS
            .iter()
            .filter(|limit| limit.scope == Scope::Unit)
            .map(|limit| limit.field.name)
            .collect()
    }
}

impl LimitsPolicy {
    /// Every limit as `box profile show` writes it: `memory 2GiB, cpus 2, ...`.
    pub fn show_text(&self) -> String {
        let shown: Vec<String> = LIMIT_FIELDS
            .iter()
            .map(|limit| format!("{} {}", limit.field.name, (limit.get)(self).text()))
            .collect();
        shown.join(", ")
    }

    /// Every limit as `box profile show --json` writes it, in the profile's
    /// words: sizes and durations as written, cores and counts as numbers.
    pub fn show_json(&self) -> serde_json::Value {
        let shown: serde_json::Map<String, serde_json::Value> = LIMIT_FIELDS
            .iter()
            .map(|limit| (limit.field.name.to_owned(), (limit.get)(self).json()))
            .collect();
        serde_json::Value::Object(shown)
    }
}
