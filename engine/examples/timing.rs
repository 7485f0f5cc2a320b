use std::time::Instant;
fn hwm() -> String {
    std::fs::read_to_string("/proc/self/status").unwrap().lines().filter(|l| l.starts_with("VmHWM")).collect::<Vec<_>>().join(" ")
}
fn main() {
    let src = std::fs::read_to_string("/tmp/big.yaml").unwrap();
    let cat = drivetrain_engine::Catalog::new(vec![], vec!["local"]);
    println!("start {}", hwm());
    let t = Instant::now();
    let root = drivetrain_engine::yaml::parse(&src).unwrap();
    println!("tree {:?} {}", t.elapsed(), hwm());
    let stages = root.get("stages").unwrap().as_map().unwrap();
    let mut d = Vec::new();
    let mut v = Vec::new();
    for e in stages {
        let s: Option<drivetrain_engine::spec::StageSpec> = drivetrain_engine::de::from_node(&e.value, &drivetrain_engine::yaml::YamlPath::root().key("stages").key(&*e.key), &mut d);
        v.push(s);
    }
    println!("specs {:?} {} size_of StageSpec {}", t.elapsed(), hwm(), std::mem::size_of::<drivetrain_engine::spec::StageSpec>());
    drop(v); drop(root);
    let t = Instant::now();
    let v = drivetrain_engine::validate(&src, &cat);
    println!("validate {:?} {} size_of Stage {}", t.elapsed(), hwm(), std::mem::size_of::<drivetrain_engine::Stage>());
    drop(v);
}
