"""Drive logs as real fleets write them, by writers nobody here wrote, and what their own
readers decode from them: the ground truth `fleet_logs.rs` compares ingest's frames with.

    python fleet_writers.py write KIND PATH [--shuffle] [--big-endian]
    python fleet_writers.py decode PATH MAPPING_JSON   # prints JSON lines

KIND: `protobuf` (mcap-protobuf-support's writer; message classes built from a
FileDescriptorProto, no protoc), `ros2` (rosbags' rosbag2 writer, MCAP storage, the
Humble type store's sensor_msgs/Imu and nav_msgs/Odometry), `ros2-mcap` (mcap-ros2-support's
writer with the same definitions), `ros2-idl` (rosbags' rosbag2 writer, the odometry topic a
vendor message whose schema is rosidl-style IDL, registered by rosbags' own IDL parser),
`ros1` (rosbags' ROS 1 serializer and Noetic
definitions, put in MCAP by the `mcap` writer). Every kind writes the same drive: odometry
at 10 Hz (the clock), IMU at 50 Hz, lanes at 5 Hz (protobuf only: ROS has no lane
message; ROS kinds put a std_msgs/Float32 on /perception/lanes).
"""
import json
import random
import sys

N_ODOM = 40


def times():
    """(topic, log_time_ns) of every message, in time order."""
    out = []
    t0 = 1_700_000_000_000_000_000
    for i in range(N_ODOM):
        out.append(("/vehicle/odometry", t0 + i * 100_000_000))
    for i in range(N_ODOM * 5):
        out.append(("/imu/data", t0 + 7_000_000 + i * 20_000_000))
    for i in range(N_ODOM // 2):
        out.append(("/perception/lanes", t0 + 30_000_000 + i * 200_000_000))
    out.sort(key=lambda m: m[1])
    return out


def values(rng, topic):
    """Random values of one message: plain floats, so each kind carries the same."""
    return {
        "speed": rng.uniform(0, 30),
        "yaw": rng.uniform(-0.5, 0.5),
        "ax": rng.uniform(-8, 3),
        "wz": rng.uniform(-1, 1),
        "conf": rng.uniform(0, 1),
        "cov": [rng.uniform(0, 1) for _ in range(9)],
        "frame": rng.choice(["base_link", "imu_link", "odom"]),
    }


def messages(shuffle):
    rng = random.Random(11)
    ms = [(topic, t, values(rng, topic)) for topic, t in times()]
    if shuffle:
        # Written out of log-time order: a recorder with several writers.
        random.Random(5).shuffle(ms)
    return ms


def proto_classes():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="fleet/telemetry.proto", package="fleet", syntax="proto3")

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for number, (fname, ftype, extra) in enumerate(fields, start=1):
            f = m.field.add(name=fname, number=number, type=ftype, label=extra.get("label", F.LABEL_OPTIONAL))
            if "type_name" in extra:
                f.type_name = extra["type_name"]

    e = fdp.enum_type.add(name="Gear")
    for i, n in enumerate(["GEAR_UNKNOWN", "PARK", "DRIVE", "REVERSE"]):
        e.value.add(name=n, number=i)
    message("Vector3", [("x", F.TYPE_DOUBLE, {}), ("y", F.TYPE_DOUBLE, {}), ("z", F.TYPE_DOUBLE, {})])
    message("Twist", [("linear", F.TYPE_MESSAGE, {"type_name": ".fleet.Vector3"}),
                      ("angular", F.TYPE_MESSAGE, {"type_name": ".fleet.Vector3"})])
    message("Odometry", [("stamp_ns", F.TYPE_UINT64, {}), ("frame_id", F.TYPE_STRING, {}),
                         ("twist", F.TYPE_MESSAGE, {"type_name": ".fleet.Twist"}),
                         ("covariance", F.TYPE_DOUBLE, {"label": F.LABEL_REPEATED}),
                         ("gear", F.TYPE_ENUM, {"type_name": ".fleet.Gear"})])
    message("Imu", [("linear_acceleration", F.TYPE_MESSAGE, {"type_name": ".fleet.Vector3"}),
                    ("angular_velocity", F.TYPE_MESSAGE, {"type_name": ".fleet.Vector3"})])
    message("Lanes", [("confidence", F.TYPE_FLOAT, {}), ("count", F.TYPE_INT32, {})])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fleet.{n}"))
            for n in ["Odometry", "Imu", "Lanes"]}


def write_protobuf(path, ms, vehicle_topic):
    from mcap_protobuf.writer import Writer

    c = proto_classes()
    with open(path, "wb") as f, Writer(f) as w:
        for topic, t, v in ms:
            out_topic = "/vehicle" if vehicle_topic and topic == "/vehicle/odometry" else topic
            if topic == "/vehicle/odometry":
                m = c["Odometry"](stamp_ns=t, frame_id=v["frame"], covariance=v["cov"], gear=2)
                m.twist.linear.x = v["speed"]
                m.twist.angular.z = v["yaw"]
            elif topic == "/imu/data":
                m = c["Imu"]()
                m.linear_acceleration.x = v["ax"]
                m.angular_velocity.z = v["wz"]
            else:
                m = c["Lanes"](confidence=v["conf"], count=2)
            w.write_message(out_topic, m, log_time=t, publish_time=t)


def ros_message(store, topic, t, v, ros1):
    """The rosbags message (and its type) of one drive message."""
    T = store.types
    if ros1:
        stamp = T["builtin_interfaces/msg/Time"](sec=t // 10**9, nanosec=t % 10**9)
        header = T["std_msgs/msg/Header"](seq=0, stamp=stamp, frame_id=v["frame"])
    else:
        stamp = T["builtin_interfaces/msg/Time"](sec=t // 10**9, nanosec=t % 10**9)
        header = T["std_msgs/msg/Header"](stamp=stamp, frame_id=v["frame"])
    V3 = T["geometry_msgs/msg/Vector3"]
    import numpy as np
    cov9 = np.array(v["cov"], dtype=np.float64)
    if topic == "/vehicle/odometry":
        pose = T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](position=T["geometry_msgs/msg/Point"](x=1.0, y=2.0, z=0.0),
                                             orientation=T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)),
            covariance=np.array(v["cov"] * 4, dtype=np.float64))
        twist = T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](linear=V3(x=v["speed"], y=0.0, z=0.0), angular=V3(x=0.0, y=0.0, z=v["yaw"])),
            covariance=np.array(v["cov"] * 4, dtype=np.float64))
        return T["nav_msgs/msg/Odometry"](header=header, child_frame_id="base_link", pose=pose, twist=twist), "nav_msgs/msg/Odometry"
    if topic == "/imu/data":
        q = T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)
        return T["sensor_msgs/msg/Imu"](header=header, orientation=q, orientation_covariance=cov9,
                                        angular_velocity=V3(x=0.0, y=0.0, z=v["wz"]), angular_velocity_covariance=cov9,
                                        linear_acceleration=V3(x=v["ax"], y=0.0, z=9.81), linear_acceleration_covariance=cov9), "sensor_msgs/msg/Imu"
    return T["std_msgs/msg/Float32"](data=v["conf"]), "std_msgs/msg/Float32"


def write_ros2(path, ms, big_endian):
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    conns = {}
    # rosbags writes a bag directory; its one .mcap file is the drive log.
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        for topic, t, v in ms:
            msg, typename = ros_message(store, topic, t, v, ros1=False)
            if topic not in conns:
                conns[topic] = w.add_connection(topic, typename, typestore=store)
            data = store.serialize_cdr(msg, typename, little_endian=not big_endian)
            w.write(conns[topic], t, bytes(data))


# A vendor message as rosidl generates its IDL (typedef'd fixed arrays, constants modules,
# annotations, bounded strings and sequences), with the message it depends on, as rosbag2
# concatenates them.
SEP = "=" * 80 + "\n"
WHEELS_IDL = SEP + """IDL: vendor_msgs/msg/Wheels
// generated from rosidl_adapter/resource/msg.idl.em
// with input from vendor_msgs/msg/Wheels.msg

#include "builtin_interfaces/msg/Time.idl"
#include "vendor_msgs/msg/Status.idl"

module vendor_msgs {
  module msg {
    typedef double double__4[4];
    module Wheels_Constants {
      const uint8 MODE_AUTO = 2;
      const string NAME = "wheels; not a field";
    };
    @verbatim (language="comment", text=
      "Wheel speeds of one axle pair.")
    struct Wheels {
      builtin_interfaces::msg::Time stamp;

      string<16> frame_id;

      @verbatim (language="comment", text="m/s, front left first")
      double__4 speeds;

      sequence<float> temps;

      sequence<int16, 8> codes;

      @default (value=2)
      uint8 mode;

      boolean braking;

      unsigned long long odometer;

      vendor_msgs::msg::Status status;
    };
  };
};
""" + SEP + """IDL: vendor_msgs/msg/Status
module vendor_msgs {
  module msg {
    /* a level and a text */
    struct Status {
      int32 level;

      string text;
    };
  };
};
"""


def idl_store():
    """The Humble type store with the types of WHEELS_IDL, read by rosbags' IDL parser."""
    from rosbags.typesys import Stores, get_typestore, get_types_from_idl

    store = get_typestore(Stores.ROS2_HUMBLE)
    for section in WHEELS_IDL.split(SEP)[1:]:
        idl = section.split("\n", 1)[1]
        # rosbags' parser takes no preprocessor lines: they go, as a preprocessor's would.
        idl = "\n".join(line for line in idl.split("\n") if not line.startswith("#"))
        store.register(get_types_from_idl(idl))
    return store


def write_ros2_idl(path, ms):
    from rosbags.rosbag2 import StoragePlugin, Writer
    import numpy as np

    store = idl_store()
    T = store.types
    conns = {}
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        for topic, t, v in ms:
            if topic == "/vehicle/odometry":
                typename = "vendor_msgs/msg/Wheels"
                msg = T[typename](
                    stamp=T["builtin_interfaces/msg/Time"](sec=t // 10**9, nanosec=t % 10**9),
                    frame_id=v["frame"],
                    speeds=np.array([v["speed"] + i for i in range(4)], dtype=np.float64),
                    temps=np.array([v["conf"], v["ax"]], dtype=np.float32),
                    codes=np.array([1, -2, int(v["yaw"] * 100)], dtype=np.int16),
                    mode=2, braking=v["ax"] < 0, odometer=t // 1000,
                    status=T["vendor_msgs/msg/Status"](level=int(v["wz"] * 1000), text=v["frame"]))
            else:
                msg, typename = ros_message(store, topic, t, v, ros1=False)
            if topic not in conns:
                msgdef = WHEELS_IDL if topic == "/vehicle/odometry" else None
                conns[topic] = w.add_connection(topic, typename, typestore=store, msgdef=msgdef,
                                                rihs01=store.hash_rihs01(typename) if msgdef else None)
            w.write(conns[topic], t, bytes(store.serialize_cdr(msg, typename)))


def write_ros2_mcap(path, ms):
    from mcap_ros2.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    schemas = {}

    def as_dict(m):
        if hasattr(m, "__dataclass_fields__"):
            return {k: as_dict(getattr(m, k)) for k in m.__dataclass_fields__ if k != "__msgtype__"}
        if hasattr(m, "tolist"):
            return m.tolist()
        return m

    with open(path, "wb") as f:
        w = Writer(f)
        for topic, t, v in ms:
            msg, typename = ros_message(store, topic, t, v, ros1=False)
            if typename not in schemas:
                text, _ = store.generate_msgdef(typename, ros_version=2)
                schemas[typename] = w.register_msgdef(typename, text)
            w.write_message(topic, schemas[typename], as_dict(msg), log_time=t, publish_time=t)
        w.finish()


def write_ros1(path, ms):
    from mcap.writer import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    channels = {}
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="ros1", library="rosbags ros1 serializer")
        for topic, t, v in ms:
            msg, typename = ros_message(store, topic, t, v, ros1=True)
            if topic not in channels:
                text, _ = store.generate_msgdef(typename, ros_version=1)
                sid = w.register_schema(name=typename.replace("/msg/", "/"), encoding="ros1msg", data=text.encode())
                channels[topic] = w.register_channel(topic=topic, message_encoding="ros1", schema_id=sid)
            data = store.serialize_ros1(msg, typename)
            w.add_message(channel_id=channels[topic], log_time=t, publish_time=t, data=bytes(data))
        w.finish()


def vehicle_class():
    """A protobuf message with the default layout's `/vehicle` fields."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="car/vehicle.proto", package="car", syntax="proto3")
    m = fdp.message_type.add(name="Vehicle")
    for number, name in enumerate(["speed_mps", "accel_x", "yaw_rate"], start=1):
        m.field.add(name=name, number=number, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("car.Vehicle"))


def write_mixed(path):
    """One `/vehicle` topic on two channels, 100 messages each: JSON (spelled `JSON`) and
    protobuf, interleaved in time."""
    from mcap.writer import Writer
    from mcap_protobuf.schema import build_file_descriptor_set

    Vehicle = vehicle_class()
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="", library="mixed encodings")
        js = w.register_schema(name="Vehicle", encoding="jsonschema", data=b"{}")
        jc = w.register_channel(topic="/vehicle", message_encoding="JSON", schema_id=js)
        ps = w.register_schema(name="car.Vehicle", encoding="protobuf",
                               data=build_file_descriptor_set(Vehicle).SerializeToString())
        pc = w.register_channel(topic="/vehicle", message_encoding="protobuf", schema_id=ps)
        for i in range(200):
            t = 1_000_000_000 + i * 50_000_000
            speed = float(i)
            if i % 2:
                w.add_message(channel_id=pc, log_time=t, publish_time=t,
                              data=Vehicle(speed_mps=speed, accel_x=-1.0).SerializeToString())
            else:
                data = json.dumps({"speed_mps": speed, "accel_x": -1.0}).encode()
                w.add_message(channel_id=jc, log_time=t, publish_time=t, data=data)
        w.finish()


def write_garbage(path, clock_garbage, other_encoding):
    """The protobuf drive with payloads that do not decode: every 10th IMU message, and
    `clock_garbage` odometry messages; `other_encoding` adds a `/vehicle/odometry`
    channel in an encoding nobody reads."""
    from mcap.writer import Writer
    from mcap_protobuf.schema import build_file_descriptor_set

    c = proto_classes()
    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="", library="garbage")
        ids = {}
        for topic, name in [("/vehicle/odometry", "Odometry"), ("/imu/data", "Imu"), ("/perception/lanes", "Lanes")]:
            sid = w.register_schema(name=f"fleet.{name}", encoding="protobuf",
                                    data=build_file_descriptor_set(c[name]).SerializeToString())
            ids[topic] = w.register_channel(topic=topic, message_encoding="protobuf", schema_id=sid)
        if other_encoding:
            sid = w.register_schema(name="x", encoding="cbor-schema", data=b"")
            cbor = w.register_channel(topic="/vehicle/odometry", message_encoding="cbor", schema_id=sid)
        n = {"/vehicle/odometry": 0, "/imu/data": 0, "/perception/lanes": 0}
        bad = b"\xff\xff\xff\xff\xff"
        for topic, t, v in messages(False):
            n[topic] += 1
            if topic == "/vehicle/odometry":
                m = c["Odometry"](stamp_ns=t)
                m.twist.linear.x = v["speed"]
                data = bad if n[topic] <= clock_garbage else m.SerializeToString()
                if other_encoding and n[topic] == 1:
                    w.add_message(channel_id=cbor, log_time=t, publish_time=t, data=b"\xa0")
            elif topic == "/imu/data":
                m = c["Imu"]()
                m.linear_acceleration.x = v["ax"]
                data = bad if n[topic] % 10 == 0 else m.SerializeToString()
            else:
                data = c["Lanes"](confidence=v["conf"]).SerializeToString()
            w.add_message(channel_id=ids[topic], log_time=t, publish_time=t, data=data)
        w.finish()


def field(obj, path):
    """`path` (`a.b[2].c`) read from a decoded message by attributes and indexes."""
    for part in path.split("."):
        name, _, rest = part.partition("[")
        obj = getattr(obj, name)
        while rest:
            idx, _, rest = rest.partition("]")
            obj = obj[int(idx)]
            rest = rest[1:] if rest.startswith("[") else rest
    if hasattr(obj, "item"):
        obj = obj.item()
    return obj


def decode(path, mapping):
    """Every message of a mapped topic, decoded by the Python readers, with the mapped
    fields' values."""
    from mcap.reader import make_reader
    from mcap_protobuf.decoder import DecoderFactory as Proto
    from mcap_ros2.decoder import DecoderFactory as Ros2
    from rosbags.typesys import Stores, get_typestore

    ros1 = get_typestore(Stores.ROS1_NOETIC)
    idl = None
    decoders = {}
    by_topic = {}
    for col, spec in mapping.items():
        topic, _, fpath = spec.partition(".")
        by_topic.setdefault(topic, []).append((col, fpath))
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[Proto(), Ros2()])
        for schema, channel, message in reader.iter_messages():
            if channel.topic not in by_topic:
                continue
            if schema.encoding == "ros2idl":
                idl = idl or idl_store()  # parsed once, not per message
                obj = idl.deserialize_cdr(message.data, schema.name)
            elif channel.message_encoding == "ros1":
                typename = schema.name.replace("/", "/msg/", 1) if "/msg/" not in schema.name else schema.name
                obj = ros1.deserialize_ros1(message.data, typename)
            else:
                if channel.id not in decoders:
                    for factory in (Proto(), Ros2()):
                        decoders[channel.id] = factory.decoder_for(channel.message_encoding, schema)
                        if decoders[channel.id] is not None:
                            break
                obj = decoders[channel.id](message.data)
            vals = {col: field(obj, fp) for col, fp in by_topic[channel.topic]}
            print(json.dumps({"topic": channel.topic, "log_time": message.log_time, "values": vals}))


def main():
    if sys.argv[1] == "write":
        kind, path = sys.argv[2], sys.argv[3]
        ms = messages("--shuffle" in sys.argv)
        {
            "protobuf": lambda: write_protobuf(path, ms, "--vehicle-topic" in sys.argv),
            "ros2": lambda: write_ros2(path, ms, "--big-endian" in sys.argv),
            "ros2-mcap": lambda: write_ros2_mcap(path, ms),
            "ros2-idl": lambda: write_ros2_idl(path, ms),
            "ros1": lambda: write_ros1(path, ms),
            "mixed": lambda: write_mixed(path),
            "garbage": lambda: write_garbage(path, int(sys.argv[4]), "--other-encoding" in sys.argv),
        }[kind]()
    else:
        decode(sys.argv[2], json.loads(sys.argv[3]))


if __name__ == "__main__":
    main()
