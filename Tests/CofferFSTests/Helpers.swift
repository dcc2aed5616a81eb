import CofferTestSupport
import Foundation
import Testing

let python = "/usr/bin/python3"

/// Runs a Python snippet with arguments; `user` runs it as that uid/gid (no supplementary groups).
@discardableResult
func py(
    _ code: String, _ args: [String] = [], uid: Int? = nil, gid: Int? = nil, groups: [Int] = [], stdin: [UInt8]? = nil
) -> ProcessResult {
    if let uid {
        let g = gid ?? uid
        let supplementary =
            groups.isEmpty ? "--clear-groups" : "--groups=" + groups.map(String.init).joined(separator: ",")
        return run(
            "/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(g)", supplementary, python, "-c", code] + args,
            stdin: stdin)
    }
    return run(python, ["-c", code] + args, stdin: stdin)
}

/// `sha256sum` of every regular file under `dir`, as "relative-path hash" lines sorted by path.
func checksums(_ dir: String) -> [String] {
    let r = sh("cd \"$0\" && find . -type f -print0 | sort -z | xargs -0r sha256sum", environment: [:], dir: dir)
    return r.out.split(separator: "\n").map(String.init)
}

/// `stat` of every entry under `dir`: path, type, mode, owner, group, size and mtime (symlinks
/// not followed), sorted by path.
func statListing(_ dir: String, format: String = "%n %F %a %u %g %s %Y") -> [String] {
    let r = sh(
        "cd \"$0\" && find . -mindepth 1 -print0 | sort -z | xargs -0r stat -c '\(format)'", environment: [:], dir: dir)
    return r.out.split(separator: "\n").map(String.init)
}

/// `sh` with "$0" bound to `dir`.
func sh(_ command: String, environment: [String: String], dir: String) -> ProcessResult {
    run("/bin/sh", ["-c", command, dir], environment: environment)
}

func text(_ bytes: [UInt8]?) -> String? { bytes.map { String(decoding: $0, as: UTF8.self) } }

/// Builds a tree outside the mount: folders, files of assorted sizes (some random, some
/// compressible, one empty), symlinks, varied modes and old mtimes. Throws if any step fails, so
/// a test never compares copies of a tree that was not what it says.
func makeSourceTree(_ root: String, files: Int = 40, seed: UInt64 = 1) throws {
    func check(_ ok: Bool, _ what: @autoclosure () -> String) throws {
        guard ok else { throw FixtureError("makeSourceTree: \(what()) failed: errno \(errno)") }
    }
    let fm = FileManager.default
    for dir in ["/a/b/c", "/empty", "/d e"] {
        try fm.createDirectory(atPath: root + dir, withIntermediateDirectories: true)
    }
    let dirs = ["", "/a", "/a/b", "/a/b/c", "/d e"]
    for i in 0..<files {
        let size = [0, 1, 100, 4096, 65_536, 200_000, 1_300_000][i % 7] + i
        let bytes =
            i % 3 == 0
            ? Array(String(repeating: "line \(i)\n", count: size / 8 + 1).utf8.prefix(size))
            : pseudoRandomBytes(count: size, seed: seed &* 1000 &+ UInt64(i))
        let path = root + dirs[i % dirs.count] + "/file-\(i).\(i % 2 == 0 ? "txt" : "bin")"
        let mode: mode_t = [0o644, 0o600, 0o755, 0o640][i % 4]
        let written = writeFile(path, bytes, mode: mode)
        try check(written == 0, "writing \(path) (\(written))")
        try check(chmod(path, mode) == 0, "chmod \(path)")
        let touched = sh("touch -h -d @\(1_000_000_000 + i * 3_600) \"$0\"", environment: [:], dir: path)
        try check(touched.status == 0, "touch \(path): \(touched.err)")
    }
    try check(symlink("file-1.bin", root + "/link-rel") == 0, "symlink link-rel")
    try check(symlink("/nonexistent/target", root + "/link-dangling") == 0, "symlink link-dangling")
    try check(symlink("../file-0.txt", root + "/a/link-up") == 0, "symlink a/link-up")
    try check(chmod(root + "/a/b", 0o750) == 0, "chmod a/b")
    let touched = sh(
        "touch -h -d @1100000000 \"$0\"/link-rel \"$0\"/a/b \"$0\"/empty \"$0\"/a/b/c", environment: [:], dir: root)
    try check(touched.status == 0, "touch: \(touched.err)")
}
