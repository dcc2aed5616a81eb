import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A memory figure of a running process from /proc/PID/status, in KiB: `VmRSS` (resident now),
/// `VmHWM` (the peak resident set since it started). Nil if the process is gone.
public func processMemoryKiB(_ pid: pid_t, _ field: String = "VmRSS") -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    return status.split(separator: "\n").first { $0.hasPrefix(field + ":") }
        .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") }
}

/// Runs a program under /usr/bin/time and returns what it did and its own peak resident set in
/// KiB. (wait4's figure for a child this process spawns would count this process's memory too:
/// see `ProcessResult.maxRSSKiB`; `time` forks a small process, so its child's figure is clean.)
public func runMeasuringPeak(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:]
) throws -> (result: ProcessResult, peakKiB: Int) {
    let dir = TemporaryDirectory("coffer-time")
    let report = dir.path + "/time.out"
    let r = run("/usr/bin/time", ["-f", "%M", "-o", report, executable] + arguments, environment: environment)
    guard let text = try? String(contentsOfFile: report, encoding: .utf8),
        let kib = text.split(separator: "\n").last.flatMap({ Int($0.trimmingCharacters(in: .whitespaces)) })
    else { throw FixtureError("/usr/bin/time reported no peak for \(executable) (is package `time` installed?)") }
    return (r, kib)
}

/// Writes the small files `indices` of a tree shaped like `scripts/bench scale`'s:
/// `root/tTTT/sSSS/fNNNNNNN`, `perFolder` files per folder and `foldersPerTop` folders per top
/// folder, so consecutive ranges extend one tree. Each file holds 1-`maxSize` pseudo-random bytes,
/// or nothing with `maxSize` 0. Returns how many folders it created, `root` included.
@discardableResult
public func writeSmallFileTree(
    at root: String, indices: Range<Int>, perFolder: Int = 100, foldersPerTop: Int = 10, maxSize: Int = 64,
    seed: UInt64 = 21
) throws -> Int {
    var folders = 0
    func makeFolder(_ path: String) throws {
        if mkdir(path, 0o755) == 0 {
            folders += 1
        } else if errno != EEXIST {
            throw FixtureError("mkdir \(path): \(String(cString: strerror(errno)))")
        }
    }
    try makeFolder(root)
    var rng = SplitMix(seed: seed)
    var buffer = [UInt8](repeating: 0, count: maxSize)
    var folderPath = ""
    for i in indices {
        let folder = i / perFolder
        if folderPath.isEmpty || i % perFolder == 0 {
            let top = root + "/" + "t" + pad(folder / foldersPerTop, 3)
            if folderPath.isEmpty || folder % foldersPerTop == 0 { try makeFolder(top) }
            folderPath = top + "/s" + pad(folder % foldersPerTop, 3)
            try makeFolder(folderPath)
        }
        let size = maxSize > 0 ? 1 + rng.int(maxSize) : 0
        for j in 0..<size { buffer[j] = UInt8(truncatingIfNeeded: rng.next()) }
        let path = folderPath + "/f" + pad(i, 7)
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw FixtureError("create \(path): \(String(cString: strerror(errno)))") }
        let written = size > 0 ? buffer.withUnsafeBytes { write(fd, $0.baseAddress, size) } : 0
        let closed = close(fd)
        guard written == size, closed == 0 else {
            throw FixtureError("write \(path): \(String(cString: strerror(errno)))")
        }
    }
    return folders
}

private func pad(_ n: Int, _ width: Int) -> String {
    let s = String(n)
    return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
}
