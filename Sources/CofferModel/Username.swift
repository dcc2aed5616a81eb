import Foundation

/// The one username rule, shared by devices and the server. A username is Unicode, compared the
/// way people read it: `Val`, `val`, `VAL` and `ｖａｌ` are one account.
///
/// - The stored and shown form is the NFKC normalisation of what was typed (compatibility
///   variants such as full-width letters or ligatures become their plain letters).
/// - It has 1 to `maxBytes` UTF-8 bytes, of letters, combining marks after a letter, digits and
///   `. _ - @ +` (no spaces, controls or other symbols).
/// - Two usernames are the same account when their `key`s are equal: NFKC after full case
///   folding (upper- then lowercasing, so `ß` and `SS` agree). The server keeps the key unique.
public enum Username {
    public static let maxBytes = 64
    public static let rule = "a username has 1 to \(maxBytes) bytes of letters, digits and . _ - @ +"

    /// The form to store and show, or nil if `name` breaks the rule.
    public static func normalized(_ name: String) -> String? {
        // Before normalising: NFKC can make one character eighteen (U+FDFA), so an unbounded
        // input would cost unbounded work; no valid name is longer than this to begin with.
        guard name.utf8.count <= maxBytes * 4 else { return nil }
        let n = name.precomposedStringWithCompatibilityMapping
        guard !n.isEmpty, n.utf8.count <= maxBytes else { return nil }
        var previousIsLetter = false
        for s in n.unicodeScalars {
            switch s.properties.generalCategory {
            case .uppercaseLetter, .lowercaseLetter, .titlecaseLetter, .modifierLetter, .otherLetter:
                previousIsLetter = true
            case .nonspacingMark, .spacingMark, .enclosingMark:
                guard previousIsLetter else { return nil }
            case .decimalNumber, .letterNumber, .otherNumber:
                previousIsLetter = false
            default:
                guard "._-@+".unicodeScalars.contains(s) else { return nil }
                previousIsLetter = false
            }
        }
        return n
    }

    /// The key usernames are unique by, or nil if `name` breaks the rule.
    public static func key(_ name: String) -> String? {
        guard let n = normalized(name) else { return nil }
        return n.uppercased().lowercased().precomposedStringWithCompatibilityMapping
    }
}
