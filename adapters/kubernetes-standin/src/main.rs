//! `meridian-kube-standin`: the stand-in Kubernetes API server on its own, for trying
//! the Kubernetes site by hand. For tests only; pods run as local processes.

use std::path::PathBuf;

use meridian_kube_standin::{Node, Options, StandIn};

const USAGE: &str = "usage: meridian-kube-standin [--listen-kubeconfig FILE] [--work-dir DIR] [--namespace NS] [--gpus nvidia:H100:4]";

/// The product label NVIDIA's GPU feature discovery puts on nodes, for a model name.
fn gpu_product(model: &str) -> String {
    match model {
        "H100" => "NVIDIA-H100-80GB-HBM3".into(),
        "H200" => "NVIDIA-H200".into(),
        "A100" => "NVIDIA-A100-SXM4-80GB".into(),
        other => format!("NVIDIA-{other}"),
    }
}

fn parse() -> Result<(Options, Option<PathBuf>), String> {
    let mut kubeconfig = None;
    let mut work_dir =
        std::env::temp_dir().join(format!("meridian-kube-standin-{}", std::process::id()));
    let mut namespace = "meridian".to_string();
    let mut gpus = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--listen-kubeconfig" => kubeconfig = Some(PathBuf::from(value)),
            "--work-dir" => work_dir = PathBuf::from(value),
            "--namespace" => namespace = value,
            "--gpus" => gpus = Some(value),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    let mut options = Options::new(work_dir);
    options.namespaces = vec![namespace];
    if let Some(spec) = gpus {
        let parts: Vec<&str> = spec.split(':').collect();
        let [vendor, model, count] = parts.as_slice() else {
            return Err(format!("--gpus wants VENDOR:MODEL:COUNT, got {spec:?}"));
        };
        let count: u32 = count
            .parse()
            .map_err(|_| format!("bad GPU count in {spec:?}"))?;
        let mut node = Node::new("standin-gpu-1", 32, 256 << 30);
        node.extended.insert(format!("{vendor}.com/gpu"), count);
        node.labels
            .insert(format!("{vendor}.com/gpu.product"), gpu_product(model));
        node.labels
            .insert(format!("{vendor}.com/gpu.count"), count.to_string());
        options.nodes.push(node);
    }
    Ok((options, kubeconfig))
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let (options, kubeconfig_path) = match parse() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let namespace = options.namespaces[0].clone();
    let work_dir = options.work_dir.clone();
    let standin = match StandIn::start(options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot start: {e}");
            std::process::exit(1);
        }
    };
    if let Some(path) = kubeconfig_path {
        if let Err(e) = std::fs::write(&path, standin.kubeconfig(&namespace)) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("kubeconfig: {}", path.display());
    }
    println!(
        "Kubernetes stand-in at {} (namespace {namespace}, pod output under {})",
        standin.url(),
        work_dir.display()
    );
    println!("Ctrl-C stops it and every pod process.");
    let _ = tokio::signal::ctrl_c().await;
    standin.shutdown();
}
