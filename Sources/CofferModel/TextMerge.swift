/// Line-based three-way merge of text documents (diff3), with git-style conflict markers where
/// both sides changed the same lines differently. Pure: bytes in, bytes out.
public enum TextMerge {
    /// Documents larger than this are not merged line by line (treated as binary conflicts).
    public static let maxBytes = 4 * 1024 * 1024

    /// Whether `bytes` is text we may merge: valid UTF-8, no NUL, within the size limit.
    public static func isText(_ bytes: [UInt8]) -> Bool {
        guard bytes.count <= maxBytes, !bytes.contains(0) else { return false }
        return String(validating: bytes, as: UTF8.self) != nil
    }

    public struct Result: Equatable, Sendable {
        public var merged: [UInt8]
        public var hasConflicts: Bool
    }

    /// Merges `local` and `remote`, both derived from `base`.
    public static func merge(
        base: [UInt8], local: [UInt8], remote: [UInt8],
        localLabel: String = "local", remoteLabel: String = "remote"
    ) -> Result {
        if local == remote { return Result(merged: local, hasConflicts: false) }
        if local == base { return Result(merged: remote, hasConflicts: false) }
        if remote == base { return Result(merged: local, hasConflicts: false) }
        let b = lines(base)
        let l = lines(local)
        let r = lines(remote)
        let ml = matches(b, l)
        let mr = matches(b, r)
        var out: [[UInt8]] = []
        var conflicts = false
        var ib = 0
        var il = 0
        var ir = 0
        // Walk the base; a base line matched on both sides is a stable anchor. Between anchors,
        // each side's chunk is either unchanged, changed on one side, or changed on both.
        func flush(toBase nb: Int, toLocal nl: Int, toRemote nr: Int) {
            let cb = Array(b[ib..<nb])
            let cl = Array(l[il..<nl])
            let cr = Array(r[ir..<nr])
            if cl == cr {
                out += cl
            } else if cl == cb {
                out += cr
            } else if cr == cb {
                out += cl
            } else {
                conflicts = true
                out.append(Array("<<<<<<< \(localLabel)\n".utf8))
                out += terminated(cl)
                out.append(Array("=======\n".utf8))
                out += terminated(cr)
                out.append(Array(">>>>>>> \(remoteLabel)\n".utf8))
            }
            ib = nb
            il = nl
            ir = nr
        }
        var k = 0
        while k < b.count {
            if let jl = ml[k], let jr = mr[k], jl >= il, jr >= ir {
                flush(toBase: k, toLocal: jl, toRemote: jr)
                out.append(b[k])
                ib = k + 1
                il = jl + 1
                ir = jr + 1
            }
            k += 1
        }
        flush(toBase: b.count, toLocal: l.count, toRemote: r.count)
        return Result(merged: out.flatMap { $0 }, hasConflicts: conflicts)
    }

    /// A conflict block must start on a fresh line even if a side's last line had no newline.
    static func terminated(_ ls: [[UInt8]]) -> [[UInt8]] {
        guard let last = ls.last, last.last != 0x0a else { return ls }
        return Array(ls.dropLast()) + [last + [0x0a]]
    }

    /// Splits into lines, each keeping its newline (the last may lack one).
    static func lines(_ bytes: [UInt8]) -> [[UInt8]] {
        var out: [[UInt8]] = []
        var start = 0
        for (i, c) in bytes.enumerated() where c == 0x0a {
            out.append(Array(bytes[start...i]))
            start = i + 1
        }
        if start < bytes.count { out.append(Array(bytes[start...])) }
        return out
    }

    /// For each line of `a`, the index of the line of `b` it is matched to by a longest common
    /// subsequence (Myers' O(ND) algorithm on line hashes), or nil.
    static func matches(_ a: [[UInt8]], _ b: [[UInt8]]) -> [Int?] {
        var ids: [[UInt8]: Int] = [:]
        func id(_ line: [UInt8]) -> Int {
            if let i = ids[line] { return i }
            let i = ids.count
            ids[line] = i
            return i
        }
        let x = a.map(id)
        let y = b.map(id)
        var result = [Int?](repeating: nil, count: a.count)
        // Trim common prefix and suffix: most edits are small, so this does most of the work.
        var pre = 0
        while pre < x.count && pre < y.count && x[pre] == y[pre] {
            result[pre] = pre
            pre += 1
        }
        var suf = 0
        while suf < x.count - pre && suf < y.count - pre && x[x.count - 1 - suf] == y[y.count - 1 - suf] {
            result[x.count - 1 - suf] = y.count - 1 - suf
            suf += 1
        }
        let xs = Array(x[pre..<(x.count - suf)])
        let ys = Array(y[pre..<(y.count - suf)])
        for (i, j) in myers(xs, ys) { result[pre + i] = pre + j }
        return result
    }

    /// Matched index pairs of an LCS of `a` and `b` (Myers 1986, with the trace kept for backtracking).
    static func myers(_ a: [Int], _ b: [Int]) -> [(Int, Int)] {
        let n = a.count
        let m = b.count
        if n == 0 || m == 0 { return [] }
        let max = n + m
        let offset = max
        var v = [Int](repeating: 0, count: 2 * max + 2)
        var trace: [[Int]] = []
        var found = false
        for d in 0...max {
            trace.append(v)
            var k = -d
            while k <= d {
                var xk: Int
                if k == -d || (k != d && v[offset + k - 1] < v[offset + k + 1]) {
                    xk = v[offset + k + 1]
                } else {
                    xk = v[offset + k - 1] + 1
                }
                var yk = xk - k
                while xk < n && yk < m && a[xk] == b[yk] {
                    xk += 1
                    yk += 1
                }
                v[offset + k] = xk
                if xk >= n && yk >= m {
                    found = true
                    break
                }
                k += 2
            }
            if found {
                trace.append(v)
                break
            }
        }
        // Backtrack through the saved frontiers.
        var pairs: [(Int, Int)] = []
        var xk = n
        var yk = m
        var d = trace.count - 2
        while d >= 0 && (xk > 0 || yk > 0) {
            let vd = trace[d]
            let k = xk - yk
            let prevK: Int
            if k == -d || (k != d && vd[offset + k - 1] < vd[offset + k + 1]) { prevK = k + 1 } else { prevK = k - 1 }
            let prevX = d == 0 ? 0 : vd[offset + prevK]
            let prevY = prevX - prevK
            while xk > prevX && yk > prevY {
                xk -= 1
                yk -= 1
                pairs.append((xk, yk))
            }
            if d == 0 { break }
            xk = prevX
            yk = prevY
            d -= 1
        }
        return pairs.reversed()
    }
}
