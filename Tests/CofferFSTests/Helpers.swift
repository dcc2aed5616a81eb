import CofferTestSupport
import Foundation
import Testing

let python = "/usr/bin/python3"

/// Runs a Python snippet with arguments; `user` runs it as that uid/gid (no supplementary groups).
@discardableResult
func py(_ code: String, _ args: [String] = [], uid: Int? = nil, gid: Int? = nil, groups: [Int] = [], stdin: [UInt8]? = nil) -> ProcessResult {
    if let uid {
        let g = gid ?? uid
        let supplementary = groups.isEmpty ? "--clear-groups" : "--groups=" + groups.map(String.init).joined(separator: ",")
        return run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(g)", supplementary, python, "-c", code] + args, stdin: stdin)
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
    let r = sh("cd \"$0\" && find . -mindepth 1 -print0 | sort -z | xargs -0r stat -c '\(format)'", environment: [:], dir: dir)
    return r.out.split(separator: "\n").map(String.init)
}

/// `sh` with "$0" bound to `dir`.
func sh(_ command: String, environment: [String: String], dir: String) -> ProcessResult {
    run("/bin/sh", ["-c", command, dir], environment: environment)
}

func text(_ bytes: [UInt8]?) -> String? { bytes.map { String(decoding: $0, as: UTF8.self) } }

/// Builds a tree outside the mount: folders, files of assorted sizes (some random, some
/// compressible, one empty), symlinks, varied modes and old mtimes.
func makeSourceTree(_ root: String, files: Int = 40, seed: UInt64 = 1) {
    let fm = FileManager.default
    try? fm.createDirectory(atPath: root + "/a/b/c", withIntermediateDirectories: true)
    try? fm.createDirectory(atPath: root + "/empty", withIntermediateDirectories: true)
    try? fm.createDirectory(atPath: root + "/d e", withIntermediateDirectories: true)
    let dirs = ["", "/a", "/a/b", "/a/b/c", "/d e"]
    for i in 0..<files {
        let size = [0, 1, 100, 4096, 65_536, 200_000, 1_300_000][i % 7] + i
        let bytes = i % 3 == 0 ? Array(String(repeating: "line \(i)\n", count: size / 8 + 1).utf8.prefix(size))
                               : pseudoRandomBytes(count: size, seed: seed &* 1000 &+ UInt64(i))
        let path = root + dirs[i % dirs.count] + "/file-\(i).\(i % 2 == 0 ? "txt" : "bin")"
        writeFile(path, bytes, mode: [0o644, 0o600, 0o755, 0o640][i % 4])
        chmod(path, [0o644, 0o600, 0o755, 0o640][i % 4])
        let t = 1_000_000_000 + i * 3_600
        _ = sh("touch -h -d @\(t) \"$0\"", environment: [:], dir: path)
    }
    _ = symlink("file-1.bin", root + "/link-rel")
    _ = symlink("/nonexistent/target", root + "/link-dangling")
    _ = symlink("../file-0.txt", root + "/a/link-up")
    chmod(root + "/a/b", 0o750)
    _ = sh("touch -h -d @1100000000 \"$0\"/link-rel \"$0\"/a/b \"$0\"/empty \"$0\"/a/b/c", environment: [:], dir: root)
}
