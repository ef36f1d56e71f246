//! Dependencies, task groups and task elements of allocations (and of DAG edges).

use super::*;
use crate::kinds::dag::Dag;
use serde_json::json;

fn errors<T: Resource + serde::de::DeserializeOwned>(v: serde_json::Value) -> Vec<String> {
    let mut o: T = serde_json::from_value(v).expect("parses");
    o.fill_type_meta();
    match o.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.to_string().lines().map(String::from).collect(),
    }
}

fn alloc(labels: serde_json::Value, spec: serde_json::Value) -> serde_json::Value {
    let mut spec = spec;
    spec["entrypoint"] = json!("/bin/true");
    json!({"metadata": {"name": "b", "namespace": "t1", "labels": labels}, "spec": spec})
}

#[test]
fn mutex_names_a_lock() {
    let v = alloc(
        json!({}),
        json!({"dependsOn": [{"gpu_lock.v2": "mutex"}, "other-lock:mutex", {"ref": "prep"}]}),
    );
    assert!(errors::<Allocation>(v.clone()).is_empty());
    let a: Allocation = serde_json::from_value(v).unwrap();
    assert_eq!(
        a.spec.depends_on[0].kind(),
        Some(DependencyKind::Mutex("gpu_lock.v2"))
    );
    assert_eq!(a.spec.depends_on[1].description(), "mutex:other-lock");
    assert_eq!(
        serde_json::to_value(&a.spec.depends_on[0]).unwrap(),
        json!({"ref": "gpu_lock.v2", "condition": "mutex"})
    );
    // A lock and an allocation of the same name are different entries.
    let both = alloc(
        json!({}),
        json!({"dependsOn": [{"x": "mutex"}, {"x": "success"}]}),
    );
    assert!(errors::<Allocation>(both).is_empty());
    let bad = alloc(
        json!({}),
        json!({"dependsOn": [{"ref": "a lock", "condition": "mutex"}]}),
    );
    let e = errors::<Allocation>(bad);
    assert!(e.iter().any(|l| l.contains("is not a lock name")), "{e:?}");
    let twice = alloc(json!({}), json!({"dependsOn": ["l:mutex", {"l": "mutex"}]}));
    let e = errors::<Allocation>(twice);
    assert!(e.iter().any(|l| l.contains("listed twice")), "{e:?}");
}

#[test]
fn corresponding_needs_a_task_group_or_an_element() {
    let dep = json!({"dependsOn": [{"a": "corresponding"}]});
    let e = errors::<Allocation>(alloc(json!({}), dep.clone()));
    assert!(
        e.iter().any(|l| l.contains("needs spec.taskGroup")),
        "{e:?}"
    );
    let mut group = dep.clone();
    group["taskGroup"] = json!({"range": "0-3"});
    assert!(errors::<Allocation>(alloc(json!({}), group)).is_empty());
    // An element of a job array carries its array's corresponding entries.
    let element = alloc(json!({TASK_INDEX_LABEL: "2"}), dep);
    assert!(errors::<Allocation>(element).is_empty());
}

#[test]
fn task_index_delay_and_any_of_parse_round_trip_and_describe() {
    let v = alloc(
        json!({}),
        json!({"dependsOn": [
            {"ref": "prep", "condition": "success", "delay": "5m", "anyOf": true},
            {"ref": "sweep", "taskIndex": 3, "condition": "any", "anyOf": true},
            {"ref": "sweep", "condition": "success"},
            {"ref": "server", "condition": "started", "delay": 90},
            {"singleton": true, "anyOf": true},
        ]}),
    );
    assert_eq!(errors::<Allocation>(v.clone()), Vec::<String>::new());
    let a: Allocation = serde_json::from_value(v).unwrap();
    let d = &a.spec.depends_on;
    assert_eq!(
        d[0],
        Dependency::on("prep", DependencyCondition::Success)
            .delayed("5m")
            .alternative()
    );
    assert_eq!(d[0].delay_seconds(), Some(300));
    assert_eq!(
        d[1],
        Dependency::on("sweep", DependencyCondition::Any)
            .task(3)
            .alternative()
    );
    assert_eq!(d[3].delay.as_deref(), Some("90s"), "a number is seconds");
    assert!(d[4].any_of && d[4].singleton);
    let desc: Vec<String> = d.iter().map(Dependency::description).collect();
    assert_eq!(
        desc,
        [
            "afterok:prep+300s",
            "afterany:sweep_3",
            "afterok:sweep",
            "after:server+90s",
            "singleton"
        ]
    );
    // Round trip: the long form with the new keys, absent when unset.
    let back = serde_json::to_value(d).unwrap();
    assert_eq!(
        back,
        json!([
            {"ref": "prep", "condition": "success", "delay": "5m", "anyOf": true},
            {"ref": "sweep", "condition": "any", "taskIndex": 3, "anyOf": true},
            {"ref": "sweep", "condition": "success"},
            {"ref": "server", "condition": "started", "delay": "90s"},
            {"singleton": true, "anyOf": true},
        ])
    );
    let again: Vec<Dependency> = serde_json::from_value(back).unwrap();
    assert_eq!(&again, d);
    // YAML reads the same.
    let y: Vec<Dependency> = serde_yaml::from_str(
        "- {ref: prep, condition: success, delay: 5m, anyOf: true}\n- {ref: sweep, taskIndex: 3, condition: any, anyOf: true}\n",
    )
    .unwrap();
    assert_eq!(y[..], d[..2]);
    for bad in [
        json!({"ref": "a", "delay": -5}),
        json!({"ref": "a", "delay": 1.5}),
    ] {
        let e = serde_json::from_value::<Dependency>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("delay"), "{e}");
    }
    // Defaults are today's behaviour.
    let plain: Dependency = serde_json::from_value(json!({"ref": "a"})).unwrap();
    assert_eq!(
        (plain.task_index, plain.delay.as_deref(), plain.any_of),
        (None, None, false)
    );
    assert_eq!(plain.standalone_option(), None);
    assert_eq!(d[1].standalone_option(), Some("taskIndex"));
}

#[test]
fn task_index_delay_and_any_of_errors_name_the_field_and_the_fix() {
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (
            json!({"beginTime": 10, "taskIndex": 1}),
            "dependsOn[0].taskIndex",
            "needs ref",
        ),
        (
            json!({"ref": "a", "condition": "corresponding", "taskIndex": 1}),
            "dependsOn[0].taskIndex",
            "remove taskIndex",
        ),
        (
            json!({"ref": "l", "condition": "mutex", "taskIndex": 1}),
            "dependsOn[0].taskIndex",
            "lock",
        ),
        (
            json!({"ref": "a", "taskIndex": 1_000_000_000u64}),
            "dependsOn[0].taskIndex",
            "not a task index",
        ),
        (
            json!({"singleton": true, "delay": "5m"}),
            "dependsOn[0].delay",
            "beginTime",
        ),
        (
            json!({"ref": "a", "condition": "corresponding", "delay": "5m"}),
            "dependsOn[0].delay",
            "remove delay",
        ),
        (
            json!({"ref": "a", "delay": "soon"}),
            "dependsOn[0].delay",
            "not a duration",
        ),
        (
            json!({"symbol": "s", "type": "in", "anyOf": true}),
            "dependsOn[0].anyOf",
            "remove anyOf",
        ),
        (
            json!({"ref": "l", "condition": "mutex", "anyOf": true}),
            "dependsOn[0].anyOf",
            "remove anyOf",
        ),
        (
            json!({"ref": "a", "condition": "corresponding", "anyOf": true}),
            "dependsOn[0].anyOf",
            "taskIndex",
        ),
    ];
    for (dep, path, fix) in cases {
        let spec = json!({"dependsOn": [dep.clone()], "taskGroup": {"range": "0-3"}});
        let e = errors::<Allocation>(alloc(json!({}), spec));
        assert!(
            e.iter().any(|l| l.contains(path) && l.contains(fix)),
            "{dep}: {e:?}"
        );
    }
    // One element of an array is an entry of its own; the same element twice is not.
    let ok = alloc(
        json!({}),
        json!({"dependsOn": [{"ref": "s"}, {"ref": "s", "taskIndex": 1}, {"ref": "s", "taskIndex": 2}]}),
    );
    assert_eq!(errors::<Allocation>(ok), Vec::<String>::new());
    let twice = alloc(
        json!({}),
        json!({"dependsOn": [{"ref": "s", "taskIndex": 1}, {"ref": "s", "taskIndex": 1, "condition": "any"}]}),
    );
    let e = errors::<Allocation>(twice);
    assert!(
        e.iter()
            .any(|l| l.contains("dependsOn[1].taskIndex") && l.contains("listed twice")),
        "{e:?}"
    );
}

#[test]
fn task_range_contains_without_expanding() {
    let r = TaskRange::parse("0-9,20-30:5,99999").unwrap();
    for i in [0, 9, 20, 25, 30, 99999] {
        assert!(r.contains(i), "{i}");
    }
    for i in [10, 19, 21, 31, 100000] {
        assert!(!r.contains(i), "{i}");
    }
}

fn dag(tasks: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": "d", "namespace": "t1"}, "spec": {"allocations": tasks}})
}

#[test]
fn dag_edges_refuse_the_standalone_dependency_options() {
    let spec = json!({"entrypoint": "/bin/true"});
    for (opt, v) in [
        ("taskIndex", json!(3)),
        ("delay", json!("5m")),
        ("anyOf", json!(true)),
    ] {
        let mut edge = json!({"ref": "a", "condition": "success"});
        edge[opt] = v;
        let d = dag(json!([
            {"name": "a", "spec": spec},
            {"name": "b", "dependsOn": [edge], "spec": spec},
        ]));
        let e = errors::<Dag>(d);
        assert!(
            e.iter().any(
                |l| l.contains(&format!("spec.allocations[1].dependsOn[0].{opt}"))
                    && l.contains("standalone allocations")
            ),
            "{opt}: {e:?}"
        );
    }
}

#[test]
fn dag_mutex_edges_are_locks_not_tasks() {
    let spec = json!({"entrypoint": "/bin/true"});
    let ok = dag(json!([
        {"name": "a", "dependsOn": [{"gpu": "mutex"}], "spec": spec},
        {"name": "b", "dependsOn": [{"gpu": "mutex"}, {"a": "success"}], "spec": spec},
        // A lock named like a task (even this one) is no edge: no cycle, no self edge.
        {"name": "c", "dependsOn": [{"c": "mutex"}, {"d": "mutex"}], "spec": spec},
        {"name": "d", "dependsOn": [{"c": "success"}], "spec": spec},
    ]));
    assert!(errors::<Dag>(ok).is_empty());
    let bad = dag(json!([
        {"name": "a", "dependsOn": [{"ref": "no such lock!", "condition": "mutex"}], "spec": spec},
        {"name": "b", "dependsOn": [{"l": "mutex"}, {"l": "mutex"}], "spec": spec},
        {"name": "c", "dependsOn": [{"a": "started"}], "spec": spec},
    ]));
    let e = errors::<Dag>(bad);
    assert!(
        e.iter()
            .any(|l| l.contains("spec.allocations[0].dependsOn[0].ref")
                && l.contains("not a lock name")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("spec.allocations[1].dependsOn[1].ref")
                && l.contains("listed twice")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|l| l.contains("corresponding or mutex")),
        "{e:?}"
    );
    assert_eq!(e.len(), 3, "{e:?}");
}

#[test]
fn task_elements_carry_their_index_in_the_template() {
    let spec = AllocationSpec {
        entrypoint: Some("python sweep.py --config=${INDEX} --seed ${INDEX}".into()),
        task_group: Some(TaskGroup {
            range: "0-99".into(),
            concurrency: Some(20),
        }),
        ..Default::default()
    };
    let e = spec.task_element(7);
    assert_eq!(
        e.entrypoint.as_deref(),
        Some("python sweep.py --config=7 --seed 7")
    );
    assert!(e.task_group.is_none());
    let spec = AllocationSpec {
        entrypoint: Some("/usr/bin/sweep".into()),
        args: vec!["--config=${INDEX}".into(), "$INDEX".into()],
        ..Default::default()
    };
    let e = spec.task_element(42);
    assert_eq!(e.args, ["--config=42", "$INDEX"]);
    assert_eq!(e.entrypoint.as_deref(), Some("/usr/bin/sweep"));
}

#[test]
fn launch_is_for_steps_and_names_what_it_cannot_do() {
    let step = |launch: serde_json::Value| {
        alloc(
            json!({}),
            json!({"stepOf": "job", "requeue": {"policy": "never"}, "launch": launch}),
        )
    };
    let ok = errors::<Allocation>(step(
        json!({"mpi": "pmi2", "distribution": "cyclic", "gpusPerTask": 2}),
    ));
    // (The step's owner reference is checked apart.)
    assert!(!ok.iter().any(|l| l.contains("spec.launch")), "{ok:?}");
    let ok = errors::<Allocation>(step(json!({"mpi": "pmix"})));
    assert!(!ok.iter().any(|l| l.contains("spec.launch")), "{ok:?}");

    let e = errors::<Allocation>(step(json!({"gpusPerTask": 0})));
    assert!(
        e.iter().any(|l| l.contains("spec.launch.gpusPerTask")),
        "{e:?}"
    );
    // Unknown values are refused by the schema, not ignored.
    let bad: Result<Allocation, _> = serde_json::from_value(step(json!({"mpi": "openmpi"})));
    assert!(bad.is_err());
    let bad: Result<Allocation, _> = serde_json::from_value(step(json!({"cpuBind": "sockets"})));
    assert!(bad.is_err());
    // Not a step: no task layout to apply it to.
    let e = errors::<Allocation>(alloc(json!({}), json!({"launch": {"mpi": "pmi2"}})));
    assert!(
        e.iter()
            .any(|l| l.contains("spec.launch") && l.contains("job steps only")),
        "{e:?}"
    );
}
