//! Command-line arguments (clap derive). Every flag is documented; defaults are
//! the ones a first run on a laptop needs (stand-in data, tiny model, CPU).
//!
//! Clap reads each flag's value with the parsers of [`crate::config`] and
//! checks only what has no typed field (`--cpu`, which is the absence of
//! `--gpu`; `--file` or a statement). The rules between the options of the
//! engine's configuration (`--on-budget` needs a budget, `--workers` instead
//! of local devices, ...) are [`EngineConfig::validate`]'s, run by
//! [`Cli::validate`] once clap is done, so the Python package, which fills the
//! same fields from keyword arguments, is held to the same rules.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    self, BackendSpec, CostConfig, EngineConfig, ModelChoice, Names, QueryConfig,
    RemoteWorkerParts, RowErrorChoice, SchedulerSpec, TablesConfig, UsageError, fraction,
    non_negative, positive, seconds,
};

/// aisql: SQL that calls a language model per row, from Substrait plans.
#[derive(Debug, Parser)]
#[command(name = "aisql", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Checks the flags of the commands that fill in the engine's typed
    /// configuration by its rules ([`EngineConfig::validate`]), once clap has
    /// read them and before anything runs.
    pub fn validate(&self) -> Result<(), UsageError> {
        match &self.command {
            Command::Query(args) => args.backend.validate(Some(&args.limits), &args.cost),
            Command::Sql(args) => args.backend.validate(Some(&args.limits), &args.cost),
            Command::Bench(args) => args.run.backend.validate(None, &args.run.cost),
            Command::Worker(args) => args.backend.spec().map(drop),
            Command::Serve(args) => args.connect.config(false).map(drop),
            Command::Explain { .. }
            | Command::Data(_)
            | Command::Model(_)
            | Command::KvStore(_) => Ok(()),
        }
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the operator tree of a plan, or the DataFusion plan of a SQL
    /// statement with its AI operators, prompts and estimated prompt tokens.
    Explain {
        /// Substrait plan file (.json ProtoJSON, or .substrait/.pb binary), a
        /// QUAIL-B query id (IMDB-7), or a SQL statement over the QUAIL-B tables.
        plan: String,
        #[command(flatten)]
        plans: PlansArg,
        /// QUAIL-B data root whose tables a SQL statement reads (default: the
        /// usual look-up, else the stand-in corpus).
        #[arg(long, env = "AISQL_ROOT")]
        root: Option<PathBuf>,
        /// Scale factor of those tables.
        #[arg(long, default_value_t = 0.1)]
        sf: f64,
    },
    /// Run one plan and print its rows.
    Query(QueryArgs),
    /// Run SQL with AI functions (ai_filter, AI_FILTER(PROMPT(...)), AI.IF(...),
    /// ai_join, ai_classify) over your tables and/or a QUAIL-B dataset.
    Sql(SqlArgs),
    /// QUAIL-B data: generate the stand-in corpus or fetch the published one.
    #[command(subcommand)]
    Data(DataCommand),
    /// Model utilities.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Run the QUAIL-B benchmark; `bench report DIR` rescores, `bench compare A B` compares.
    Bench(BenchArgs),
    /// Serve one model on one device to coordinators (`--workers ADDR,...` of
    /// query, sql and bench) until interrupted.
    Worker(WorkerArgs),
    /// Serve SQL with AI functions over the PostgreSQL wire protocol (psql,
    /// psycopg, JDBC, BI tools), read-only, until interrupted.
    Serve(ServeArgs),
    /// The on-disk KV store (`--kv-store DIR`): what it holds, whether its
    /// blocks are sound, emptying it.
    #[command(subcommand)]
    KvStore(KvStoreCommand),
}

/// `aisql kv-store …`.
#[derive(Debug, Subcommand)]
pub enum KvStoreCommand {
    /// Blocks and bytes per model identity.
    Stats {
        /// The store's folder.
        dir: PathBuf,
        /// text or json.
        #[arg(long, default_value = "text")]
        format: String,
    },
    /// Checks every block (its MAC, under this user's key, and its header);
    /// exits 1 when any is damaged. Reads only.
    Verify {
        /// The store's folder.
        dir: PathBuf,
    },
    /// Removes every block, keeping the store.
    Clear {
        /// The store's folder.
        dir: PathBuf,
    },
}

/// `aisql serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, IP:PORT (port 0: any free port; the port taken is
    /// printed). Without it: 127.0.0.1:5433. Only a loopback address may go
    /// without a password.
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<String>,
    /// File holding the password every client must give (SCRAM-SHA-256; any
    /// user and database name). Without it: AISQL_PASSWORD, if set. Required
    /// on a non-loopback address.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// PEM certificate chain to serve TLS with (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve a non-loopback address without TLS (the password is never sent,
    /// but queries and rows cross the network readable).
    #[arg(long)]
    pub insecure: bool,
    /// Authenticated sessions served at once; a client that authenticates
    /// past them is refused ("too many connections") until one closes.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub max_connections: usize,
    /// Connections still authenticating at once, in a pool of their own (one
    /// client address may hold a quarter of it); more are refused at once.
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub max_authenticating: usize,
    /// Seconds a connection has to authenticate before it is closed.
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = seconds)]
    pub auth_timeout_s: Duration,
    /// The longest message (a statement, its parameters) a client may send, in
    /// bytes; a longer one is skipped unread and answered with an error.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20,
          value_parser = clap::value_parser!(u64).range(1024..).map(|n| n as usize))]
    pub max_statement_bytes: usize,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `aisql worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Address to listen on, IP:PORT (port 0: any free port, printed). Without
    /// it: AISQL_WORKER_LISTEN if that is a loopback address, else 127.0.0.1:7878.
    /// A worker answers anyone who reaches it, so only this flag opens it to a
    /// network.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// File holding the shared worker token every coordinator call must carry
    /// (the coordinators' --worker-token-file). Without it: AISQL_WORKER_TOKEN,
    /// if set. A non-loopback --listen needs a token and TLS unless --insecure.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM certificate chain to serve TLS with (with --tls-key); coordinators
    /// then name this worker https://HOST:PORT and give --tls-ca.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve a non-loopback address without a token or without TLS (anyone who
    /// reaches the port can use the model and read its answers).
    #[arg(long)]
    pub insecure: bool,
    /// Seconds a coordinator's query may send nothing before another
    /// coordinator's waiting query takes this worker over (a coordinator that
    /// died); queries of several coordinators are served one at a time.
    #[arg(long, value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub query_idle_timeout: u64,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Where QUAIL-B query ids and the benchmark's plans come from.
#[derive(Debug, Clone, Args)]
pub struct PlansArg {
    /// QUAIL-B plans folder (catalog.json and <ID>.json files) instead of the plans
    /// built into aisql.
    #[arg(long = "plans", value_name = "DIR", env = "AISQL_QUAILB_PLANS")]
    pub dir: Option<PathBuf>,
}

/// Which backend answers AI questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Reference labels of the QUAIL-B collection.
    Oracle,
    /// A Qwen3 model.
    Model,
}

/// Where the input tables come from.
#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// QUAIL-B data root in the published layout (corpora/, collections/, label_sets/).
    /// Without it: aisql's cache, the harness's cache, else the stand-in corpus.
    #[arg(long, env = "AISQL_ROOT", conflicts_with = "tables")]
    pub root: Option<PathBuf>,
    /// A folder of `<table>.parquet` files (your own data; no reference labels).
    #[arg(long)]
    pub tables: Option<PathBuf>,
    /// Scale factor of the QUAIL-B corpus.
    #[arg(long, default_value_t = 0.1)]
    pub sf: f64,
    /// Reference collection id (default: the corpus's active collection).
    #[arg(long)]
    pub collection: Option<String>,
}

/// Which model runs, on which device, in which dtype.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Model: `tiny` (deterministic tiny Qwen3, generated on first use), a local
    /// directory (config.json, *.safetensors[, tokenizer.json]), a GGUF file (or a
    /// folder holding one), or a Hugging Face id found in the local HF cache (e.g.
    /// Qwen/Qwen3-4B, or Qwen/Qwen3-4B-GGUF:Q8_0 for that repository's Q8_0 file).
    #[arg(
        id = "model",
        long = "model",
        value_name = "MODEL",
        default_value = "tiny",
        env = "AISQL_MODEL"
    )]
    pub name: String,
    /// Run on the CPU (the default without --gpu).
    #[arg(long, conflicts_with = "gpu")]
    pub cpu: bool,
    /// Run on CUDA device N (needs a build with `--features cuda`). For query,
    /// sql and bench a list (`--gpu 0,1,2,3`) runs one worker per device, each
    /// document's questions on one of them; with --simulate: that many simulated
    /// devices.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',', num_args = 1)]
    pub gpu: Option<Vec<usize>>,
    /// Weights format: f32, bf16 or f16, or q8_0 / q4k to quantize safetensors
    /// weights at load (CPU; embeddings and norms stay f32). Default: f32 on CPU,
    /// bf16 on GPU; a GGUF model keeps its file's formats.
    #[arg(long)]
    pub dtype: Option<String>,
}

/// How AI questions are answered: backend, model, device and caching.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Backend: model (a Qwen3) or oracle (reference labels; needs a QUAIL-B root).
    #[arg(long, value_enum, default_value = "model")]
    pub backend: BackendKind,
    /// With --backend oracle: run the model backend's scheduler over a virtual KV
    /// cache (no forward passes) to report the fresh tokens the model would compute.
    #[arg(long)]
    pub simulate: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Run N workers on the CPU, each with its own copy of the model and its share
    /// of the KV budget, each document's questions on one of them (with
    /// --simulate: N simulated devices).
    #[arg(long, value_name = "N", value_parser = config::worker_count)]
    pub cpu_workers: Option<u16>,
    /// Send the questions to `aisql worker`s at these addresses (HOST:PORT,
    /// comma-separated), each document's questions to one of them; the workers'
    /// model answers (they must all serve one model and dtype).
    #[arg(
        long,
        value_name = "ADDR[,ADDR...]",
        value_delimiter = ',',
        num_args = 1,
        conflicts_with = "cpu"
    )]
    pub workers: Option<Vec<String>>,
    /// File holding the shared token of the --workers (their --token-file);
    /// sent on every call. Without it: AISQL_WORKER_TOKEN, if set.
    #[arg(long, value_name = "FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// PEM certificate(s) of the CA that signed the TLS certificates of
    /// https:// --workers.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The longest one call to a --workers worker (its share of a batch, a
    /// measurement) may wait for the answer before the query fails naming the
    /// worker. A stopped or unreachable worker is caught sooner, within about
    /// 30 s, by HTTP/2 keep-alive; this bounds a worker that answers those but
    /// never its work. Default: 1800.
    #[arg(long, value_name = "SECONDS", value_parser = config::at_least_one::<u64>)]
    pub worker_timeout_s: Option<u64>,
    /// Reuse document KV across questions, partners and rows (off: every prompt from scratch).
    #[arg(long, value_enum, default_value = "on")]
    pub prefix_cache: Switch,
    /// Before a document's KV is dropped, ask it the questions later operators
    /// will ask it under another name (IMDB-9's r2 after r1), so it is not
    /// computed twice (off: ask each operator's questions in its turn).
    #[arg(long, value_enum, default_value = "on")]
    pub lookahead: Switch,
    /// KV memory budget in MiB (default on CPU: a quarter of free memory, at most
    /// 16 GiB; on a GPU: 70 % of its memory left free by the weights, less 4 GiB).
    #[arg(long, value_parser = config::number::<usize>)]
    pub kv_budget_mb: Option<usize>,
    /// Host memory in MiB for KV moved off the device, brought back by copy
    /// instead of recomputed (0: none; default on a GPU: a quarter of free host
    /// memory; on the CPU: none; in simulation: 256 GiB, an H200's share of its host).
    #[arg(long, value_parser = config::number::<usize>)]
    pub kv_host_mb: Option<usize>,
    /// Tokens per forward batch.
    #[arg(long, default_value_t = 8192, value_parser = config::number::<usize>)]
    pub batch_tokens: usize,
    /// Keep documents' KV in DIR, keyed by the model's weights, dtype and
    /// device and the prompt's tokens, and read it back instead of computing
    /// it again, in later queries and after a restart. Each block is checked
    /// (a MAC) before use; a damaged or foreign one is computed again. DIR
    /// must be new, empty or an earlier store.
    #[arg(long, value_name = "DIR", env = "AISQL_KV_STORE")]
    pub kv_store: Option<PathBuf>,
    /// The KV store's bound, e.g. 4G or 512M (default 16G); least recently
    /// used blocks leave first.
    #[arg(long, value_name = "SIZE", value_parser = aisql_engine::limits::host_memory::parse_size)]
    pub kv_store_size: Option<usize>,
    /// Keep documents' KV after the query that computed them, within the KV
    /// budget, so that later queries over the same documents compute only
    /// their questions (default: on; `aisql bench` starts each query from
    /// nothing unless told `--keep-kv on`, so that its fresh tokens are the
    /// query's own).
    #[arg(long, value_enum)]
    pub keep_kv: Option<Switch>,
    /// Rows streamed through the AI operators at a time: a chain of operators
    /// finishes one batch of documents while their KV is still cached.
    #[arg(long, default_value_t = 256, value_parser = config::number::<usize>)]
    pub batch_rows: usize,
    /// Memory DataFusion's operators may hold per query (AI-join partner sides,
    /// hash tables, sorts, result rows), e.g. 8G or 512M; default half of the
    /// host's memory. Past it the query fails naming the operators that hold most.
    #[arg(long, value_name = "SIZE", value_parser = aisql_engine::limits::host_memory::parse_size)]
    pub memory_limit: Option<usize>,
    /// Prompt layout: raw-v1 (reference) or qwen3-chat-nonthinking-v1.
    #[arg(long, default_value = "raw-v1")]
    pub prompt_format: String,
    /// Keep the model's answers in DIR as they are produced, keyed by model,
    /// weights, tokenizer, dtype, prompt format and rendered prompt: a query that
    /// died is run again without asking the model what it already answered.
    #[arg(long, value_name = "DIR", env = "AISQL_ANSWER_CACHE")]
    pub answer_cache: Option<PathBuf>,
    /// On a GPU: auto (aisql's CUDA kernels for attention and the answer head,
    /// cuBLAS for shared-prefix runs with a lot of work), all (the attention kernel
    /// for every sequence) or off (candle ops only).
    #[arg(long, value_enum, default_value = "auto", env = "AISQL_CUDA_KERNELS")]
    pub cuda_kernels: CudaKernelsArg,
}

impl BackendArgs {
    /// The typed backend spec these flags give, validated.
    pub fn spec(&self) -> Result<BackendSpec, UsageError> {
        let workers = RemoteWorkerParts {
            addrs: self.workers.clone(),
            token_file: self.worker_token_file.clone(),
            tls_ca: self.tls_ca.clone(),
            call_timeout: self.worker_timeout_s.map(Duration::from_secs),
        }
        .join(Names::Flags)?;
        let spec = BackendSpec {
            kind: match self.backend {
                BackendKind::Oracle => config::BackendKind::Oracle,
                BackendKind::Model => config::BackendKind::Model,
            },
            simulate: self.simulate,
            model: self.model.choice(),
            cpu_workers: self.cpu_workers,
            workers,
            answer_cache: self.answer_cache.clone(),
            prompt_format: self.prompt_format.clone(),
            cuda_kernels: match self.cuda_kernels {
                CudaKernelsArg::Auto => aisql_kernels::CudaKernels::Auto,
                CudaKernelsArg::All => aisql_kernels::CudaKernels::All,
                CudaKernelsArg::Off => aisql_kernels::CudaKernels::Off,
            },
            scheduler: SchedulerSpec {
                prefix_cache: self.prefix_cache == Switch::On,
                lookahead: self.lookahead == Switch::On,
                kv_budget_mb: self.kv_budget_mb,
                kv_host_mb: self.kv_host_mb,
                kv_store: self.kv_store.clone(),
                kv_store_size: self.kv_store_size.map(|n| n as u64),
                batch_tokens: self.batch_tokens,
            },
        };
        spec.validate(Names::Flags)?;
        Ok(spec)
    }

    /// The statement options these flags give (with `limits` and `cost`),
    /// validated.
    pub fn query_config(
        &self,
        limits: Option<&LimitArgs>,
        cost: &CostArgs,
    ) -> Result<QueryConfig, UsageError> {
        let defaults = QueryConfig::default();
        let query = QueryConfig {
            batch_rows: self.batch_rows,
            memory_limit: self.memory_limit,
            max_recursion: limits.map_or(defaults.max_recursion, |l| l.max_recursion),
            timeout: limits.and_then(|l| l.timeout_s),
            cost: cost.config(),
            keep_kv: self.keep_kv.map(|s| s == Switch::On),
        };
        query.validate(Names::Flags)?;
        Ok(query)
    }

    /// Checks these flags with `limits` and `cost` as the typed
    /// configuration's rules do ([`EngineConfig::validate`]).
    pub fn validate(&self, limits: Option<&LimitArgs>, cost: &CostArgs) -> Result<(), UsageError> {
        let spec = self.spec()?;
        let query = self.query_config(limits, cost)?;
        config::check_spend(&query.cost, &spec, Names::Flags)
    }
}

impl ModelArgs {
    /// The typed model choice these flags give.
    pub fn choice(&self) -> ModelChoice {
        ModelChoice {
            name: self.name.clone(),
            gpu: self.gpu.clone(),
            dtype: self.dtype.clone(),
        }
    }
}

impl TableArgs {
    /// The typed table sources these flags give; a malformed `--table` is a
    /// usage error.
    pub fn config(&self) -> Result<TablesConfig, UsageError> {
        Ok(TablesConfig {
            tables: self
                .tables
                .iter()
                .map(|t| config::table_arg(t))
                .collect::<Result<_, _>>()?,
            lenient_csv: self.lenient_csv,
            root: self.root.clone(),
            sf: self.sf,
            collection: self.collection.clone(),
            default_dataset: self.default_dataset,
        })
    }
}

impl ConnectArgs {
    /// The engine configuration these flags give, validated.
    pub fn config(&self, allow_writes: bool) -> Result<EngineConfig, UsageError> {
        let config = EngineConfig {
            tables: self.data.config()?,
            backend: self.backend.spec()?,
            query: self.backend.query_config(Some(&self.limits), &self.cost)?,
            allow_writes,
        };
        config.validate(Names::Flags)?;
        Ok(config)
    }
}

/// `--cuda-kernels` (see `aisql_kernels::CudaKernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaKernelsArg {
    /// Kernels, cuBLAS for large shared-prefix runs.
    Auto,
    /// The attention kernel for every sequence.
    All,
    /// Candle ops only.
    Off,
}

/// An on/off switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `aisql query`.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Substrait plan file (.json ProtoJSON, or .substrait/.pb binary), or a QUAIL-B
    /// query id (IMDB-7).
    pub plan: String,
    #[command(flatten)]
    pub plans: PlansArg,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Write rows.parquet, answer tables and plan.substrait here (SPEC §D.6 layout).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    #[command(flatten)]
    pub rows: RowOutputArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub cost: CostArgs,
}

/// How long and how deep one query may run (`aisql query`, `aisql sql`).
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Stop the query after SECONDS (planning, reading, model work) and fail
    /// naming this limit: DataFusion stops at its next batch, the model after
    /// the forward batch in flight. Rows already streamed stay whole: printed
    /// csv/json is closed, --output-dir's rows.parquet holds the rows so far.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub timeout_s: Option<Duration>,
    /// Iterations a recursive CTE (WITH RECURSIVE) may run; past them the
    /// query fails naming the CTE.
    #[arg(long, value_name = "N",
          default_value_t = aisql_engine::sql::recursion::DEFAULT_MAX_RECURSION,
          value_parser = config::at_least_one::<usize>)]
    pub max_recursion: usize,
}

/// What a query may cost, what it is estimated to cost, and what one bad row
/// does (`aisql query`, `aisql sql`, `aisql bench`).
#[derive(Debug, Clone, Args)]
pub struct CostArgs {
    /// Price of one GPU-hour in USD: the dollars of estimates and of
    /// --max-cost-usd (default for those: the benchmark's price,
    /// `aisql_engine::estimate::DEFAULT_GPU_HOURLY_RATE_USD`, $3.50); a benchmark records costs only
    /// when it is given.
    #[arg(long = "gpu-hourly-rate-usd", alias = "gpu-hour-usd", value_name = "PRICE",
          value_parser = non_negative, allow_negative_numbers = true)]
    pub gpu_hourly_rate_usd: Option<f64>,
    /// Print the estimate (rows, input, minimum, fresh and decode tokens,
    /// seconds, dollars per AI operator and in total) instead of running the
    /// query: the model is asked only about a seeded sample of rows.
    #[arg(long)]
    pub estimate: bool,
    /// Rows per AI operator an estimate asks the backend about (the rest follow
    /// the sample's answers, or a --selectivity hint).
    #[arg(long, value_name = "N", default_value_t = 48,
          value_parser = config::at_least_one::<usize>)]
    pub estimate_sample: usize,
    /// Stop model work once the query has computed N fresh tokens (checked
    /// before every forward batch).
    #[arg(long, value_name = "N", value_parser = config::at_least_one::<u64>,
          allow_negative_numbers = true)]
    pub max_fresh_tokens: Option<u64>,
    /// Stop model work once the model has run S seconds in this query.
    #[arg(long, value_name = "S", value_parser = positive, allow_negative_numbers = true)]
    pub max_model_seconds: Option<f64>,
    /// Stop model work once the model's time has cost D dollars at
    /// --gpu-hourly-rate-usd.
    #[arg(long, value_name = "D", value_parser = positive, allow_negative_numbers = true)]
    pub max_cost_usd: Option<f64>,
    /// What a spent budget does: fail (the default) or partial (the rows
    /// completed so far, with each AI operator's coverage).
    #[arg(long, value_enum, value_name = "fail|partial")]
    pub on_budget: Option<OnBudget>,
    /// What a row the model cannot answer does (a prompt longer than the
    /// model's context, generated tokens that are not text): fail the query
    /// naming the row (the default), or give NULL for that row's AI value (a
    /// filter or join drops it), listing the first failed rows.
    #[arg(long, value_enum, value_name = "fail|null")]
    pub on_row_error: Option<OnRowError>,
    /// How the AI operators' progress shows on stderr: auto (lines updated in
    /// place with rows done of expected, fresh tokens, tokens/s and an ETA,
    /// only when stderr is a terminal), json (one JSON line per second, for
    /// programs) or off. The expected rows come from an estimate made first
    /// (a model backend only).
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressArg,
    /// The largest fraction of an AI operator's rows that may fail before the
    /// query fails naming them; implies --on-row-error null (which alone
    /// allows any fraction). Not with --on-row-error fail.
    #[arg(long, value_name = "R", value_parser = fraction, allow_negative_numbers = true)]
    pub max_error_ratio: Option<f64>,
}

/// `--progress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressArg {
    /// Lines on a terminal, nothing otherwise.
    Auto,
    /// One JSON line per second on stderr.
    Json,
    /// Nothing.
    Off,
}

impl CostArgs {
    /// The typed cost options these flags give.
    pub fn config(&self) -> CostConfig {
        CostConfig {
            gpu_hourly_rate_usd: self.gpu_hourly_rate_usd,
            estimate: self.estimate,
            estimate_sample: self.estimate_sample,
            max_fresh_tokens: self.max_fresh_tokens,
            max_model_seconds: self.max_model_seconds,
            max_cost_usd: self.max_cost_usd,
            on_budget: self.on_budget.map(|b| match b {
                OnBudget::Fail => config::OnBudget::Fail,
                OnBudget::Partial => config::OnBudget::Partial,
            }),
            on_row_error: self.on_row_error.map(|e| match e {
                OnRowError::Fail => RowErrorChoice::Fail,
                OnRowError::Null => RowErrorChoice::Null,
            }),
            progress: self.progress_mode(),
            max_error_ratio: self.max_error_ratio,
        }
    }

    /// How the AI operators' progress shows.
    pub fn progress_mode(&self) -> aisql_engine::exec::progress::ProgressMode {
        use aisql_engine::exec::progress::ProgressMode;
        match self.progress {
            ProgressArg::Auto => ProgressMode::Terminal,
            ProgressArg::Json => ProgressMode::Json,
            ProgressArg::Off => ProgressMode::Hidden,
        }
    }
}

/// `--on-budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnBudget {
    /// Fail the query, naming the budget.
    Fail,
    /// Return the rows completed so far and each AI operator's coverage.
    Partial,
}

/// `--on-row-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnRowError {
    /// Fail the query, naming the row.
    Fail,
    /// NULL for that row's AI value, counted per operator.
    Null,
}

/// How result rows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RowFormat {
    /// An aligned table.
    Table,
    /// CSV with a header line.
    Csv,
    /// A JSON array of objects.
    Json,
}

/// Where printed and saved rows go.
#[derive(Debug, Clone, Args)]
pub struct RowOutputArgs {
    /// How rows are printed on stdout.
    #[arg(long, value_enum, default_value = "table")]
    pub format: RowFormat,
    /// Also save all rows to FILE, in the format its extension names (.parquet,
    /// .csv, .json). Written whole or not at all.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print at most this many rows (all rows are always saved). Default: 50
    /// for the terminal table, every row for csv and json.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

/// Rows the terminal table prints without `--limit`.
pub const TABLE_ROWS: usize = 50;

impl RowOutputArgs {
    /// How many rows are printed: `--limit`, else [`TABLE_ROWS`] for the table
    /// and every row (`None`) for csv and json, which programs read whole.
    pub fn print_limit(&self) -> Option<usize> {
        match self.format {
            RowFormat::Table => Some(self.limit.unwrap_or(TABLE_ROWS)),
            RowFormat::Csv | RowFormat::Json => self.limit,
        }
    }
}

/// `aisql sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The SQL statement. Without it and without -f, on a terminal: a shell
    /// (statements end with ';', \? lists its commands).
    #[arg(conflicts_with = "file")]
    pub query: Option<String>,
    /// Read the statement from FILE.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub data: TableArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub rows: RowOutputArgs,
    /// Write the plan as Substrait to FILE (ProtoJSON for .json, else binary)
    /// instead of running it; `aisql query FILE` runs it.
    #[arg(long, value_name = "FILE")]
    pub to_substrait: Option<PathBuf>,
    /// Let statements write or change the session: `COPY ... TO` a path outside
    /// every input, `CREATE VIEW`, `CREATE TABLE ... AS`, `DROP`, `SET`. Without
    /// it SQL is read-only. `CREATE EXTERNAL TABLE` and writes into the tables
    /// given are refused either way.
    #[arg(long)]
    pub allow_writes: bool,
    /// Expected fraction of rows an AI filter keeps, TEXT=FRACTION, TEXT being
    /// a piece of that filter's prompt. A relation's AI filters run cheapest
    /// per dropped row first (prompt size / (1 - FRACTION); 0.5 without a hint).
    /// Repeatable.
    #[arg(long = "selectivity", value_name = "TEXT=FRACTION")]
    pub selectivity: Vec<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub cost: CostArgs,
}

/// Where a SQL session's tables come from: `aisql sql`, `aisql serve` and the
/// Python package.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// A table: NAME=PATH, a .parquet, .csv or .json (JSON lines) file or a folder
    /// of them. Repeatable.
    #[arg(long = "table", value_name = "NAME=PATH")]
    pub tables: Vec<String>,
    /// Read malformed CSV tables as DataFusion's reader does: a row's missing
    /// fields are nulls, a quote left open runs to the end of the file. Without
    /// it such a file is an error naming its line.
    #[arg(long)]
    pub lenient_csv: bool,
    /// QUAIL-B data root whose tables (reviews, aspects, reports, terms, claims,
    /// evidence, citation_contexts, citation_passages, agent_traces) are registered
    /// too. Without it and without --table: aisql's cache, else the stand-in corpus.
    #[arg(long, env = "AISQL_ROOT")]
    pub root: Option<PathBuf>,
    /// Scale factor of the QUAIL-B corpus.
    #[arg(long, default_value_t = 0.1)]
    pub sf: f64,
    /// Reference collection id (default: the corpus's active collection).
    #[arg(long)]
    pub collection: Option<String>,
    /// Whether no --table and no --root means the dataset aisql finds (the
    /// command line) or no dataset (the Python package, whose tables usually
    /// come later, from `register`).
    #[arg(skip = true)]
    pub default_dataset: bool,
}

/// What a long-lived SQL session opens: its tables, its model and backend, and
/// each statement's limits and budget (`aisql serve`, the shell, the Python
/// package's `connect`).
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub data: TableArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub cost: CostArgs,
}

/// `aisql data …`.
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Generate the deterministic stand-in corpus with labels.
    Generate {
        /// Scale factor (0.1, 0.5, 1.0 match the published row counts; any > 0 works).
        #[arg(long, default_value_t = 0.1)]
        sf: f64,
        /// Output root (default: ~/.cache/aisql/quailb-standin/).
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Download the published corpus and collection (needs network access to S3).
    Fetch {
        /// Scale factor: 0.1, 0.5 or 1.0.
        #[arg(long, default_value_t = 0.1)]
        sf: f64,
        /// Destination root (default: ~/.cache/aisql/quailb/).
        #[arg(long)]
        dest: Option<PathBuf>,
    },
}

/// `aisql model …`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write the deterministic tiny Qwen3 (real tokenizer, random weights).
    Tiny {
        /// Output folder (config.json, model.safetensors, tokenizer.json); must
        /// not exist or be empty, unless --force.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace the model already in --out (a folder holding config.json
        /// and safetensors weights, nothing else). A folder holding anything
        /// else is refused even so.
        #[arg(long)]
        force: bool,
    },
    /// Write a Qwen3 of a released model's shape with seeded random weights
    /// (config.json, model.safetensors in f32, tokenizer.json): for throughput
    /// comparisons at real sizes without a download.
    Random {
        /// The shape: qwen3-0.6b (28 layers, hidden 1024) or tiny.
        #[arg(long, value_enum)]
        shape: RandomShape,
        /// Output folder; must not exist or be empty, unless --force.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace the model already in --out (a folder holding config.json
        /// and safetensors weights, nothing else). A folder holding anything
        /// else is refused even so.
        #[arg(long)]
        force: bool,
    },
    /// Write a safetensors model as a GGUF file that llama.cpp (and aisql) load:
    /// its shape and tokenizer as metadata, its weights in --type.
    Gguf {
        /// The safetensors model: `tiny`, a local folder or a Hugging Face id in
        /// the local cache.
        #[arg(long, value_name = "MODEL")]
        model: String,
        /// The GGUF file to write (ending in .gguf); must not exist, nor be
        /// inside the model's folder.
        #[arg(long)]
        out: PathBuf,
        /// f32, f16, q8_0 or q4_k_m (llama.cpp's Q4_K_M mix: Q4_K, and Q6_K for
        /// the output head and some attn_v / ffn_down).
        #[arg(long = "type", value_name = "TYPE")]
        file_type: String,
    },
    /// Time the model's prefill (prompt processing) on its device: SEQUENCES
    /// prompts of PROMPT_TOKENS distinct tokens in one packed forward, after one
    /// warm-up forward; prints tokens/s and CPU seconds per round. Threads: set
    /// RAYON_NUM_THREADS.
    Bench(ModelBenchArgs),
    /// Continue a prompt with the model's greedy (most likely) tokens, until
    /// <|im_end|> or <|endoftext|> or --max-tokens.
    Generate(GenerateArgs),
    /// Measure the model's throughput on its device and dtype (short prompts,
    /// long prompts, decoding: about a minute) and keep the profile in aisql's
    /// cache folder, where estimates (`--estimate`, EXPLAIN) find it.
    Calibrate(CalibrateArgs),
}

/// The shapes `aisql model random` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RandomShape {
    /// Qwen3-0.6B: 28 layers, hidden 1024, 16 query / 8 KV heads of 128,
    /// intermediate 3072, tied embeddings.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// The tiny test model (2 layers, hidden 64).
    Tiny,
}

/// `aisql model bench`.
#[derive(Debug, Args)]
pub struct ModelBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens in each prompt.
    #[arg(long, value_name = "N", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub prompt_tokens: usize,
    /// Prompts packed into one forward.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=4096).map(|n| n as usize))]
    pub sequences: usize,
    /// Measure greedy decoding instead of prefill: N tokens generated for each
    /// sequence, all continuing one cached prompt of --prompt-tokens (its last
    /// token each sequence's own); 0 measures prefill.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=131_072).map(|n| n as usize))]
    pub decode_tokens: usize,
    /// Measured forwards (measured generations with --decode-tokens).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=1000).map(|n| n as usize))]
    pub rounds: usize,
    /// text: a line per round and the median; json: one JSON object per round.
    #[arg(long, value_enum, default_value = "text")]
    pub format: GenerateFormat,
}

/// `aisql model calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// text: a summary; json: the profile as kept.
    #[arg(long, value_enum, default_value = "text")]
    pub format: GenerateFormat,
}

/// `aisql model generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to continue, tokenized as written: no special tokens added and no
    /// chat template (write `<|im_start|>user ...` yourself for a chat turn).
    #[arg(long)]
    pub prompt: String,
    /// The most tokens to generate.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub max_tokens: usize,
    /// text: the generated text; json: one object with prompt_token_ids,
    /// token_ids, text and finish ("stop" or "length").
    #[arg(long, value_enum, default_value = "text")]
    pub format: GenerateFormat,
}

/// How `aisql model generate` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenerateFormat {
    /// The generated text.
    Text,
    /// One JSON object.
    Json,
}

/// `aisql bench`: run the QUAIL-B queries, or rescore / compare saved runs.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Rescore or compare saved runs instead of running the benchmark.
    #[command(subcommand)]
    pub action: Option<BenchAction>,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

/// `aisql bench report|compare`.
#[derive(Debug, Subcommand)]
pub enum BenchAction {
    /// Rescore a run's saved outputs (no model) and rewrite run.json, report.md,
    /// measurements.parquet and the charts.
    Report {
        /// Run folder.
        dir: PathBuf,
        /// QUAIL-B data root of the run (default: as for `bench`).
        #[arg(long, env = "AISQL_ROOT")]
        root: Option<PathBuf>,
    },
    /// Compare two runs query by query, with exact McNemar tests per predicate.
    Compare {
        /// Run A (baseline).
        a: PathBuf,
        /// Run B.
        b: PathBuf,
        /// QUAIL-B data root of the runs (default: as for `bench`).
        #[arg(long, env = "AISQL_ROOT")]
        root: Option<PathBuf>,
        /// Also write the comparison as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// Flags of a benchmark run.
#[derive(Debug, Args)]
pub struct BenchRunArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Queries to run, comma-separated (e.g. IMDB-1,FEV-10), or `all` (the 43 published
    /// queries, in catalog order; the default).
    #[arg(long, value_delimiter = ',')]
    pub queries: Option<Vec<String>>,
    /// Run folder (default: a new timestamped folder under benchmark_results/). An
    /// existing non-empty folder is refused unless --resume.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Continue the run in DIR: complete queries (same definition hash) are kept, saved
    /// ones are only rescored, the rest run again.
    #[arg(long, value_name = "DIR", conflicts_with = "output_dir")]
    pub resume: Option<PathBuf>,
    #[command(flatten)]
    pub plans: PlansArg,
    /// GPUs billed per query (cost = runtime × GPUs × hourly rate; default: the
    /// devices of --gpu, else 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpu_count: Option<u32>,
    #[command(flatten)]
    pub cost: CostArgs,
    /// Per-query limit on engine time in seconds; a query over it is recorded as
    /// `timeout` and the run goes on.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub timeout_s: Option<Duration>,
    /// Extra run metadata, KEY=VALUE (repeatable; VALUE parsed as JSON when it is JSON).
    #[arg(long, value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Stop at the first query that fails, times out or cannot be scored.
    #[arg(long)]
    pub fail_fast: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed configuration's defaults are the flags' defaults.
    #[test]
    fn engine_config_defaults_are_the_flags_defaults() {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            connect: ConnectArgs,
        }
        // Variables that would stand for flags are not the defaults.
        for var in [
            "AISQL_MODEL",
            "AISQL_ROOT",
            "AISQL_ANSWER_CACHE",
            "AISQL_CUDA_KERNELS",
        ] {
            if std::env::var_os(var).is_some() {
                return;
            }
        }
        let flags = Flags::try_parse_from(["aisql"]).unwrap();
        let parsed = flags.connect.config(false).unwrap();
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", EngineConfig::default())
        );
    }

    #[test]
    fn the_flags_fill_the_typed_fields() {
        let args = Cli::try_parse_from([
            "aisql",
            "sql",
            "SELECT 1",
            "--table",
            "t=x.csv",
            "--backend",
            "oracle",
            "--simulate",
            "--kv-budget-mb",
            "64",
            "--lookahead",
            "off",
            "--timeout-s",
            "1.5",
            "--max-fresh-tokens",
            "10",
            "--on-budget",
            "partial",
            "--progress",
            "json",
        ])
        .unwrap();
        let Command::Sql(sql) = args.command else {
            panic!("not sql")
        };
        let config = ConnectArgs {
            data: sql.data,
            backend: sql.backend,
            limits: sql.limits,
            cost: sql.cost,
        }
        .config(true)
        .unwrap();
        assert_eq!(
            config.tables.tables,
            vec![("t".into(), PathBuf::from("x.csv"))]
        );
        assert_eq!(config.backend.kind, config::BackendKind::Oracle);
        assert!(config.backend.simulate && !config.backend.scheduler.lookahead);
        assert_eq!(config.backend.scheduler.config().kv_budget_bytes, 64 << 20);
        assert_eq!(config.query.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(config.query.cost.max_fresh_tokens, Some(10));
        assert_eq!(config.query.cost.on_budget, Some(config::OnBudget::Partial));
        assert_eq!(
            config.query.cost.progress,
            aisql_engine::exec::progress::ProgressMode::Json
        );
        assert!(config.allow_writes);
    }

    /// The message `flags` get from `aisql sql SELECT 1`: clap's for a bad
    /// value (its first line, without `error: `), else the typed
    /// configuration's validation's.
    fn flag_message(flags: &[&str]) -> String {
        let args = ["aisql", "sql", "SELECT 1"].iter().chain(flags);
        match Cli::try_parse_from(args) {
            Err(e) => {
                let text = e.render().to_string();
                let first = text.lines().next().unwrap_or_default();
                first.trim_start_matches("error: ").to_string()
            }
            Ok(cli) => match cli.validate() {
                Err(e) => e.0,
                Ok(()) => panic!("{flags:?} were accepted"),
            },
        }
    }

    /// The message the same options get by name, as Python's keyword
    /// arguments give them.
    fn keyword_message(options: &[(&str, config::OptionValue)]) -> String {
        let mut builder = config::ConfigBuilder::default();
        let set = options
            .iter()
            .try_for_each(|(name, value)| builder.set(Names::Keywords, name, value));
        match set.and_then(|()| builder.build(Names::Keywords)) {
            Err(e) => e.0,
            Ok(_) => panic!("{options:?} were accepted"),
        }
    }

    /// A flag's message as a keyword's: `'--timeout-s <SECONDS>'` (clap
    /// names the flag with its value's name) becomes `'timeout_s'`, every
    /// other `--max-fresh-tokens` becomes `max_fresh_tokens`.
    fn in_keywords(message: &str) -> String {
        let mut out = String::new();
        let mut rest = message;
        while let Some(at) = rest.find("--") {
            out.push_str(&rest[..at]);
            let flag = &rest[at + 2..];
            let end = flag
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(flag.len());
            out.push_str(&flag[..end].replace('-', "_"));
            rest = &flag[end..];
            // clap's ` <VALUE_NAME>` after the flag, in its quotes.
            if rest.starts_with(" <")
                && let Some(close) = rest.find(">'")
            {
                rest = &rest[close + 1..];
            }
        }
        out.push_str(rest);
        out
    }

    /// A bad value and a broken rule read the same through the flags and
    /// through the keyword arguments, the option named each one's way.
    #[test]
    fn flags_and_keywords_get_one_message() {
        use config::OptionValue::{Bool, List, Text};
        let text = |t: &str| Text(t.into());
        // (flags, the same through keyword arguments)
        type Case<'a> = (Vec<&'a str>, Vec<(&'a str, config::OptionValue)>);
        let cases: Vec<Case> = vec![
            (
                vec!["--timeout-s", "soon"],
                vec![("timeout_s", text("soon"))],
            ),
            (vec!["--timeout-s", "0"], vec![("timeout_s", text("0"))]),
            (
                vec!["--max-fresh-tokens", "0"],
                vec![("max_fresh_tokens", text("0"))],
            ),
            (
                vec!["--max-fresh-tokens", "lots"],
                vec![("max_fresh_tokens", text("lots"))],
            ),
            (
                vec!["--max-model-seconds", "nan"],
                vec![("max_model_seconds", text("nan"))],
            ),
            (
                vec!["--max-cost-usd", "-0.5"],
                vec![("max_cost_usd", text("-0.5"))],
            ),
            (
                vec!["--gpu-hourly-rate-usd", "-3"],
                vec![("gpu_hourly_rate_usd", text("-3"))],
            ),
            (
                vec!["--max-error-ratio", "2"],
                vec![("max_error_ratio", text("2"))],
            ),
            (
                vec!["--max-recursion", "0"],
                vec![("max_recursion", text("0"))],
            ),
            (
                vec!["--estimate-sample", "0"],
                vec![("estimate_sample", text("0"))],
            ),
            (vec!["--cpu-workers", "0"], vec![("cpu_workers", text("0"))]),
            (
                vec!["--worker-timeout-s", "0"],
                vec![("worker_timeout_s", text("0"))],
            ),
            (
                vec!["--batch-rows", "many"],
                vec![("batch_rows", text("many"))],
            ),
            (
                vec!["--memory-limit", "lots"],
                vec![("memory_limit", text("lots"))],
            ),
            // The rules between options.
            (
                vec!["--on-budget", "partial"],
                vec![("on_budget", text("partial"))],
            ),
            (
                vec!["--worker-token-file", "t"],
                vec![("worker_token_file", text("t"))],
            ),
            (
                vec!["--workers", "a:1", "--cpu-workers", "2"],
                vec![
                    ("workers", List(vec!["a:1".into()])),
                    ("cpu_workers", text("2")),
                ],
            ),
            (
                vec!["--workers", "a:1", "--dtype", "bf16"],
                vec![("workers", text("a:1")), ("dtype", text("bf16"))],
            ),
            (
                vec!["--cpu-workers", "2", "--gpu", "0"],
                vec![("cpu_workers", text("2")), ("gpu", text("0"))],
            ),
            (
                vec![
                    "--max-model-seconds",
                    "1",
                    "--backend",
                    "oracle",
                    "--simulate",
                ],
                vec![
                    ("max_model_seconds", text("1")),
                    ("backend", text("oracle")),
                    ("simulate", Bool(true)),
                ],
            ),
        ];
        for (flags, options) in cases {
            // Python names devices with `device=`, not an option of the table.
            let options: Vec<_> = options
                .into_iter()
                .filter(|(name, _)| *name != "gpu")
                .collect();
            let by_flags = flag_message(&flags);
            let by_keywords = if flags.contains(&"--gpu") {
                let mut builder = config::ConfigBuilder::default();
                for (name, value) in &options {
                    builder.set(Names::Keywords, name, value).unwrap();
                }
                builder.config.backend.model.gpu = Some(vec![0]);
                builder.build(Names::Keywords).unwrap_err().0
            } else {
                keyword_message(&options)
            };
            let expected = in_keywords(&by_flags)
                .replace("gpu", "device")
                .replace("device_hourly", "gpu_hourly")
                .replace("simulate runs", "simulate=True runs");
            assert_eq!(by_keywords, expected, "{flags:?}: {by_flags}");
        }
    }

    /// The rules that quote a value name it in each front end's syntax.
    #[test]
    fn rules_quote_values_in_each_front_ends_syntax() {
        use config::OptionValue::Text;
        assert!(
            flag_message(&["--on-row-error", "fail", "--max-error-ratio", "0.5"])
                .starts_with("--on-row-error fail and --max-error-ratio 0.5 contradict")
        );
        let keywords = keyword_message(&[
            ("on_row_error", Text("fail".into())),
            ("max_error_ratio", Text("0.5".into())),
        ]);
        assert!(
            keywords.starts_with("on_row_error=\"fail\" and max_error_ratio=0.5 contradict"),
            "{keywords}"
        );
        let keywords = keyword_message(&[
            ("backend", Text("oracle".into())),
            ("max_fresh_tokens", Text("9".into())),
        ]);
        assert!(
            keywords.starts_with("max_fresh_tokens: backend=\"oracle\" answers"),
            "{keywords}"
        );
    }

    #[test]
    fn an_unknown_option_is_named_with_the_known_ones() {
        let err = config::ConfigBuilder::default()
            .set(Names::Keywords, "no_such", &config::OptionValue::Bool(true))
            .unwrap_err()
            .0;
        assert!(
            err.contains("\"no_such\"") && err.contains("max_fresh_tokens"),
            "{err}"
        );
    }

    /// Every option by name is a flag of `aisql sql` (the old name
    /// `gpu_hour_usd` is the alias of one).
    #[test]
    fn every_option_is_a_flag() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let sql = cli.find_subcommand("sql").unwrap();
        for name in config::option_names() {
            let flag = name.replace('_', "-");
            assert!(
                sql.get_arguments()
                    .any(|a| a.get_long() == Some(flag.as_str())
                        || a.get_all_aliases()
                            .is_some_and(|al| al.contains(&flag.as_str()))),
                "{name}"
            );
        }
    }
}
