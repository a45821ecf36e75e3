//! The deployment files in `deploy/`, checked as far as this machine allows
//! (no Docker, no Kubernetes): every YAML file parses; each node of the
//! Compose file, the Kubernetes StatefulSet and the systemd unit gets the
//! secrets `deploy/init-secrets.sh` writes, laid out where its mounts put
//! them, its environment as the file sets it, and passes `cellfleet node
//! --check-config` as a process; the in-pod client config the preStop drain
//! uses loads; the Dockerfile provides what the Compose file calls.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn yaml(path: &Path) -> Vec<Yaml> {
    let text = std::fs::read_to_string(path).unwrap();
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(value: &Yaml) -> String {
    match value {
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// Runs `deploy/init-secrets.sh DIR SPECS...` with this build's binary.
fn init_secrets(dir: &Path, specs: &[String]) {
    let output = Command::new("sh")
        .arg(deploy().join("init-secrets.sh"))
        .arg(dir)
        .args(specs)
        .env("CELLFLEET", BIN)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "init-secrets.sh failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `cellfleet node --config CONFIG --check-config` with exactly `env` (plus
/// PATH): the summary it printed.
fn check_config(config: &Path, env: &BTreeMap<String, String>) -> String {
    let output = Command::new(BIN)
        .args(["node", "--config"])
        .arg(config)
        .arg("--check-config")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} with {env:?}: {stdout}{}",
        config.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(": OK"), "{stdout}");
    stdout
}

/// A container path under `/etc/cellfleet` or `/var/lib/cellfleet`, in `root`.
fn rooted(root: &Path, container_path: &str) -> PathBuf {
    root.join(container_path.trim_start_matches('/'))
}

/// Environment values naming container paths, moved under `root`.
fn rooted_env(root: &Path, env: BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.into_iter()
        .map(|(name, value)| {
            let value = if value.starts_with("/etc/cellfleet/") {
                rooted(root, &value).display().to_string()
            } else {
                value
            };
            (name, value)
        })
        .collect()
}

#[test]
fn compose_nodes_pass_check_config_with_the_secrets_the_compose_file_makes() {
    let dir = deploy().join("compose");
    let docs = yaml(&dir.join("compose.yaml"));
    let services = &docs[0]["services"];
    let Yaml::Hash(services) = services else {
        panic!("no services");
    };
    // The one-shot secrets service: its node specs.
    let secrets = &services[&Yaml::String("secrets".into())];
    let script: String = secrets["entrypoint"]
        .as_vec()
        .unwrap()
        .iter()
        .map(text)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        script.contains("cellfleet-init-secrets /secrets"),
        "{script}"
    );
    let specs: Vec<String> = script
        .split_whitespace()
        .filter(|word| word.contains('=') && !word.starts_with('-'))
        .map(str::to_owned)
        .collect();
    assert_eq!(specs.len(), 3, "{specs:?}");
    let root = tempfile::tempdir().unwrap();
    init_secrets(&rooted(root.path(), "/etc/cellfleet/secrets"), &specs);

    let mut checked = 0;
    let mut ports = Vec::new();
    for (name, service) in services {
        let command = service["command"]
            .as_vec()
            .map(|c| c.iter().map(text).collect::<Vec<_>>());
        let Some(command) = command.filter(|c| c.first().is_some_and(|w| w == "node")) else {
            continue;
        };
        let name = text(name);
        assert!(
            specs
                .iter()
                .any(|spec| spec.starts_with(&format!("{name}="))),
            "{name} has a certificate from the secrets service"
        );
        // Bind mounts of files from deploy/: copied where the container sees them.
        for volume in service["volumes"].as_vec().unwrap() {
            let volume = text(volume);
            let mut parts = volume.split(':');
            let (host, container) = (parts.next().unwrap(), parts.next().unwrap());
            if host.starts_with('.') {
                let target = rooted(root.path(), container);
                std::fs::create_dir_all(target.parent().unwrap()).unwrap();
                std::fs::copy(dir.join(host), &target)
                    .unwrap_or_else(|e| panic!("{name}: {host}: {e}"));
            }
        }
        let Yaml::Hash(environment) = &service["environment"] else {
            panic!("{name}: no environment");
        };
        let env = environment
            .iter()
            .map(|(k, v)| (text(k), text(v)))
            .collect();
        let config = command[command.iter().position(|w| w == "--config").unwrap() + 1].clone();
        let summary = check_config(&rooted(root.path(), &config), &rooted_env(root.path(), env));
        assert!(summary.contains(&format!("node {name} ")), "{summary}");
        assert!(
            summary.contains(
                "console: HTTPS with the node certificate, cluster-CA client certificates required"
            ),
            "{summary}"
        );
        assert!(
            summary.contains("store: S3 bucket \"cellfleet\" at http://minio:9000"),
            "{summary}"
        );
        for port in service["ports"].as_vec().unwrap() {
            ports.push(text(port));
        }
        checked += 1;
    }
    assert_eq!(checked, 3);
    let mut unique = ports.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        ports.len(),
        "host ports are distinct: {ports:?}"
    );
}

#[test]
fn the_statefulset_s_pods_pass_check_config_and_their_drain_config_loads() {
    let docs = yaml(&deploy().join("kubernetes/cellfleet.yaml"));
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| text(&d["kind"]) == kind && text(&d["metadata"]["name"]) == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    for doc in &docs {
        assert!(
            !doc["apiVersion"].is_badvalue() && !doc["kind"].is_badvalue(),
            "{doc:?}"
        );
    }
    let config_map = find("ConfigMap", "cellfleet-config");
    let s3 = find("Secret", "cellfleet-s3");
    let set = find("StatefulSet", "cellfleet");
    let service = find("Service", "cellfleet");
    assert_eq!(text(&service["spec"]["clusterIP"]), "None", "headless");
    assert_eq!(text(&set["spec"]["serviceName"]), "cellfleet");
    let pod = &set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        text(&container["readinessProbe"]["httpGet"]["path"]),
        "/readyz"
    );
    let pre_stop: Vec<String> = container["lifecycle"]["preStop"]["exec"]["command"]
        .as_vec()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert!(
        pre_stop
            .join(" ")
            .contains("cellfleet drain --config /etc/cellfleet/config/client.toml"),
        "{pre_stop:?}"
    );
    let embedded = text(&config_map["data"]["kinds.toml"]);
    assert_eq!(
        embedded,
        std::fs::read_to_string(deploy().join("kinds.toml")).unwrap(),
        "the ConfigMap's kinds.toml is deploy/kinds.toml"
    );

    let replicas = set["spec"]["replicas"].as_i64().unwrap();
    assert_eq!(replicas, 3);
    let pods: Vec<String> = (0..replicas).map(|i| format!("cellfleet-{i}")).collect();
    let specs: Vec<String> = pods
        .iter()
        .map(|p| format!("{p}={p}.cellfleet,localhost,127.0.0.1"))
        .collect();
    let root = tempfile::tempdir().unwrap();
    let made = root.path().join("made");
    init_secrets(&made, &specs);
    // The Secret is made from both directories' files (ca.key kept out);
    // the volume's items put them back under certs/ and keys/.
    let mut keys: BTreeMap<String, PathBuf> = BTreeMap::new();
    for sub in ["certs", "keys"] {
        for entry in std::fs::read_dir(made.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name != "ca.key" {
                keys.insert(name, path);
            }
        }
    }
    let secret_volume = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| text(&v["name"]) == "secrets")
        .unwrap();
    for item in secret_volume["secret"]["items"].as_vec().unwrap() {
        let key = text(&item["key"]);
        let from = keys
            .get(&key)
            .unwrap_or_else(|| panic!("item {key} is not a file init-secrets writes"));
        let to = rooted(root.path(), "/etc/cellfleet/secrets").join(text(&item["path"]));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
    let config_dir = rooted(root.path(), "/etc/cellfleet/config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let Yaml::Hash(data) = &config_map["data"] else {
        panic!("ConfigMap data");
    };
    for (name, body) in data {
        std::fs::write(config_dir.join(text(name)), text(body)).unwrap();
    }
    let Yaml::Hash(s3_data) = &s3["stringData"] else {
        panic!("cellfleet-s3 stringData");
    };
    let args: Vec<String> = container["args"]
        .as_vec()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    let config = args[args.iter().position(|a| a == "--config").unwrap() + 1].clone();
    for pod_name in &pods {
        let mut env: BTreeMap<String, String> =
            s3_data.iter().map(|(k, v)| (text(k), text(v))).collect();
        for variable in container["env"].as_vec().unwrap() {
            if variable["value"].is_badvalue() {
                continue; // POD_NAME, from the downward API
            }
            let value = text(&variable["value"]).replace("$(POD_NAME)", pod_name);
            env.insert(text(&variable["name"]), value);
        }
        let summary = check_config(&rooted(root.path(), &config), &rooted_env(root.path(), env));
        assert!(summary.contains(&format!("node {pod_name} ")), "{summary}");
        assert!(
            summary.contains(
                "console: HTTPS with the node certificate, cluster-CA client certificates required"
            ),
            "{summary}"
        );
    }
    // The preStop drain's client config: its files are mounted.
    let client = cellfleet_client::Config::read(&config_dir.join("client.toml")).unwrap();
    cellfleet_client::Client::from_config(&client).expect("the drain's client loads its files");
}

#[test]
fn the_systemd_unit_checks_and_runs_the_config_it_ships_with() {
    let unit = std::fs::read_to_string(deploy().join("systemd/cellfleet.service")).unwrap();
    let line = |key: &str| {
        unit.lines()
            .find(|l| l.starts_with(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}="))
            .split_once('=')
            .unwrap()
            .1
            .to_owned()
    };
    assert_eq!(
        line("ExecStart"),
        "/usr/local/bin/cellfleet node --config /etc/cellfleet/node.toml"
    );
    assert_eq!(
        line("ExecStartPre"),
        format!("{} --check-config", line("ExecStart"))
    );
    assert_eq!(line("KillSignal"), "SIGTERM", "SIGTERM drains");
    let root = tempfile::tempdir().unwrap();
    let etc = rooted(root.path(), "/etc/cellfleet");
    init_secrets(
        &etc.join("secrets"),
        &["n1=n1.cellfleet.internal".to_owned()],
    );
    std::fs::copy(deploy().join("systemd/node.toml"), etc.join("node.toml")).unwrap();
    std::fs::copy(deploy().join("kinds.toml"), etc.join("kinds.toml")).unwrap();
    let summary = check_config(&etc.join("node.toml"), &BTreeMap::new());
    assert!(summary.contains("node n1 "), "{summary}");
    assert!(
        summary.contains(
            "console: HTTPS with the node certificate, cluster-CA client certificates required"
        ),
        "{summary}"
    );
}

#[test]
fn the_dockerfile_provides_what_the_compose_file_calls() {
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/cellfleet"]"#));
    assert!(
        dockerfile.contains("COPY deploy/init-secrets.sh /usr/local/bin/cellfleet-init-secrets")
    );
    assert!(dockerfile.contains("cargo build --release --locked -p cellfleet"));
    let docs = yaml(&deploy().join("compose/compose.yaml"));
    let build = &docs[0]["services"]["secrets"]["build"];
    let context = deploy().join("compose").join(text(&build["context"]));
    assert!(context.join(text(&build["dockerfile"])).is_file());
}

/// A certificate from another CA, or another node's, is refused by
/// `--check-config` with what to do: it checks, it does not just parse.
#[test]
fn check_config_refuses_a_certificate_it_would_fail_on() {
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("etc");
    init_secrets(
        &etc.join("secrets"),
        &["n1=n1.cellfleet.internal".to_owned()],
    );
    let other = root.path().join("other");
    init_secrets(&other, &["n1".to_owned(), "n2".to_owned()]);
    std::fs::copy(deploy().join("systemd/node.toml"), etc.join("node.toml")).unwrap();
    std::fs::copy(deploy().join("kinds.toml"), etc.join("kinds.toml")).unwrap();
    let run = |cert: &Path, key: &Path| {
        Command::new(BIN)
            .args(["node", "--config"])
            .arg(etc.join("node.toml"))
            .arg("--check-config")
            .env("CELLFLEET_TLS_CERT", cert)
            .env("CELLFLEET_TLS_KEY", key)
            .output()
            .unwrap()
    };
    let foreign = run(
        &other.join("certs/node-n1.pem"),
        &other.join("certs/node-n1.key"),
    );
    assert_eq!(foreign.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&foreign.stderr);
    assert!(
        stderr.contains("does not verify against the cluster CA"),
        "{stderr}"
    );
    let wrong_node = run(
        &other.join("certs/node-n2.pem"),
        &other.join("certs/node-n2.key"),
    );
    assert_eq!(wrong_node.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&wrong_node.stderr);
    assert!(stderr.contains("not node \"n1\""), "{stderr}");
}
