;;; planlang-mode.el --- Major mode for planlang distributed-training plans  -*- lexical-binding: t; -*-

;; Version: 0.1.0
;; Package-Requires: ((emacs "26.1"))
;; Keywords: languages
;; URL: https://github.com/planlang/planlang (editors/emacs)
;; SPDX-License-Identifier: Apache-2.0

;; This file is part of planlang, licensed under the Apache License, Version 2.0
;; (http://www.apache.org/licenses/LICENSE-2.0).

;;; Commentary:

;; A major mode for `.plan' files: font-lock, `#' comments, indentation (one `planlang-indent-offset'
;; per open { [ ( ) and the language server through eglot (`M-x eglot' runs `planlang lsp').
;;
;; grammar/planlang.lark is the one source of truth for the syntax; tests/editors checks the word
;; lists below against it and, where emacs is installed, that font-lock marks exactly the words the
;; parser reads as keywords.  All keywords are soft: each is also a name (`attention.output.dense',
;; `for x in ...'), so a keyword is only highlighted where the grammar puts it: statement keywords at
;; the start of a line or after `;' or `{', the others after the words they follow, and never next to
;; a `.' or before `=', `:' or `['.
;;
;; Install: put this file on `load-path' and add (require 'planlang-mode) to your init file
;; (docs/editors.md).

;;; Code:

(defgroup planlang nil
  "Editing planlang (.plan) files."
  :group 'languages
  :prefix "planlang-")

(defcustom planlang-indent-offset 4
  "Columns of indentation per open bracket in `planlang-mode'."
  :type 'integer
  :safe #'integerp)

(defconst planlang-statement-keywords
  '("use" "model" "input" "device" "link" "mesh" "budget" "optimizer" "data" "shard" "pipeline"
    "stage" "checkpoint" "template" "apply" "for")
  "Keywords that start a statement or block item.
They stand at the start of a line, or after `;' or `{'.")

(defconst planlang-contextual-keywords
  '(("as" . "\\_<use[ \t]+[^ \t\n]+[ \t]+")
    ("of" . "\\(?:\\_<mesh[ \t]+[A-Za-z_][A-Za-z0-9_]*\\|\\_<shard[ \t]+\\(?:output\\|input\\)\\)[ \t]+")
    ("output" . "\\_<shard[ \t]+")
    ("input" . "\\_<shard[ \t]+")
    ("x" . "\\_<of[ \t]+[0-9]\\(?:_?[0-9]\\)*[ \t]*")
    ("over" . nil)
    ("per" . nil)
    ("device" . "\\_<per[ \t]+")
    ("schedule" . nil)
    ("microbatches" . nil)
    ("chunks" . nil)
    ("with" . nil)
    ("every" . nil)
    ("to" . nil)
    ("in" . "\\_<for[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]+")
    ("partial" . "\\][ \t]*"))
  "Other keywords, each with a regexp that must match just before it.
nil: anywhere outside a dotted name.")

(defconst planlang-keyword-followers
  '(("output" . "[ \t]+of\\_>") ("input" . "[ \t]+of\\_>") ("per" . "[ \t]+device\\_>"))
  "Words that are keywords only when followed by a match of the regexp.")

(defconst planlang-dtypes
  '("f64" "float64" "f32" "float32" "fp32" "tf32" "f16" "float16" "fp16" "bf16" "bfloat16" "fp8"
    "i64" "int64" "i32" "int32" "i16" "int16" "i8" "int8" "u8" "uint8" "bool")
  "Tensor dtypes (`input' declarations and `flops.DTYPE' fields).")

(defconst planlang-schedules '("gpipe" "1f1b" "interleaved" "looped_bfs" "zero_bubble" "zbv" "dualpipev")
  "Pipeline schedules.")

(defconst planlang-optimizers
  '("sgd" "momentum" "adam" "adamw" "adagrad" "rmsprop" "adafactor" "lion")
  "Optimizers the checker knows.")

(defconst planlang-param-kinds '("axis" "int")
  "Kinds of template parameters.")

(defconst planlang-unit-regexp
  (concat "\\(?:[KMGTP]i?B/s\\|[KMGTP]i?B\\|B/s\\|B\\|[KMGTP]b/s\\|[KMGTP]bps\\|[KMGTP]?FLOP/s"
          "\\|[KMGTP]?FLOPS\\|[num]?s\\)")
  "Memory, bandwidth, throughput and time units.")

(defconst planlang--number-regexp
  "[0-9]\\(?:_?[0-9]\\)*\\(?:\\.[0-9]\\(?:_?[0-9]\\)*\\)?\\(?:[eE][+-]?[0-9]+\\)?")

(defun planlang--in-code-p (pos)
  "Non-nil when POS is outside strings and comments."
  (not (nth 8 (save-excursion (syntax-ppss pos)))))

(defun planlang--not-a-name-p (start end)
  "Non-nil unless the word from START to END is a name.
It is one inside a dotted name, or before `=', `:', `,' or `['."
  (and (not (eq (char-before start) ?.))
       (save-excursion
         (goto-char end)
         (not (looking-at "[.[]\\|[ \t]*[=:,]")))))

(defun planlang--statement-start-p (pos)
  "Non-nil when POS starts a statement.
Only blanks stand between POS and the start of its line, a `;' or a `{'."
  (save-excursion
    (goto-char pos)
    (skip-chars-backward " \t")
    (or (bolp) (memq (char-before) '(?\; ?{)))))

(defun planlang--make-matcher (regexp accept)
  "A font-lock matcher: search for REGEXP, keep the first match ACCEPT likes.
ACCEPT is called with the start and end of the match."
  (lambda (limit)
    (let (found)
      (while (and (not found) (re-search-forward regexp limit t))
        (when (and (planlang--in-code-p (match-beginning 0))
                   (save-match-data (funcall accept (match-beginning 0) (match-end 0))))
          (setq found t)))
      found)))

(defun planlang--statement-matcher ()
  (planlang--make-matcher
   (concat "\\_<" (regexp-opt planlang-statement-keywords) "\\_>")
   (lambda (start end)
     (and (planlang--statement-start-p start) (planlang--not-a-name-p start end)))))

(defun planlang--contextual-matcher (word before)
  (let ((after (cdr (assoc word planlang-keyword-followers))))
    (planlang--make-matcher
     (concat "\\_<" (regexp-quote word) "\\_>")
     (lambda (start end)
       (and (planlang--not-a-name-p start end)
            (or (null before)
                (save-excursion (goto-char start) (looking-back before (line-beginning-position))))
            (or (null after) (save-excursion (goto-char end) (looking-at after))))))))

(defun planlang--after-matcher (before regexp)
  "Match REGEXP where BEFORE matches just before it on the same line."
  (planlang--make-matcher
   regexp
   (lambda (start _end)
     (save-excursion (goto-char start) (looking-back before (line-beginning-position))))))

(defvar planlang-font-lock-keywords
  (append
   `((,(planlang--statement-matcher) . font-lock-keyword-face))
   (mapcar (lambda (entry)
             (cons (planlang--contextual-matcher (car entry) (cdr entry))
                   (if (equal (car entry) "as") 'font-lock-preprocessor-face 'font-lock-keyword-face)))
           planlang-contextual-keywords)
   `((,(planlang--after-matcher "\\_<\\(?:model\\|device\\|link\\|mesh\\|template\\)[ \t]+"
                                "[A-Za-z_][A-Za-z0-9_]*")
      . font-lock-function-name-face)
     (,(planlang--after-matcher ":[ \t]*" (concat "\\_<" (regexp-opt planlang-dtypes) "\\_>"))
      . font-lock-type-face)
     (,(planlang--after-matcher "\\_<flops[ \t]*\\.[ \t]*" (concat (regexp-opt planlang-dtypes) "\\_>"))
      . font-lock-type-face)
     (,(planlang--after-matcher "[(,][ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*:[ \t]*"
                                (concat "\\_<" (regexp-opt planlang-param-kinds) "\\_>"))
      . font-lock-type-face)
     (,(planlang--after-matcher "\\_<schedule[ \t]+" (concat (regexp-opt planlang-schedules) "\\_>"))
      . font-lock-constant-face)
     (,(planlang--after-matcher "^[ \t]*optimizer[ \t]+" (concat (regexp-opt planlang-optimizers) "\\_>"))
      . font-lock-constant-face)
     (,(planlang--make-matcher (concat "\\_<\\(?:true\\|false\\|none\\)\\_>")
                               (lambda (start end) (planlang--not-a-name-p start end)))
      . font-lock-constant-face)
     (,(concat "\\(?:^\\|[^A-Za-z0-9_.]\\)\\(" planlang--number-regexp "\\)[ \t]*\\("
               planlang-unit-regexp "\\)\\(?:[^A-Za-z0-9_/]\\|$\\)")
      (1 font-lock-constant-face) (2 font-lock-type-face))
     ("\\?" . font-lock-builtin-face)
     ("[-+']" . font-lock-warning-face)
     ("#[ \t]*\\(plan:[ \t]*ignore\\(?:-file\\)?\\[[A-Za-z0-9_, \t]*\\]\\)" 1 font-lock-preprocessor-face t)))
  "Font-lock rules for `planlang-mode'.")

(defvar planlang-mode-syntax-table
  (let ((table (make-syntax-table)))
    (modify-syntax-entry ?# "<" table)
    (modify-syntax-entry ?\n ">" table)
    (modify-syntax-entry ?\" "\"" table)
    (modify-syntax-entry ?\\ "\\" table)
    (modify-syntax-entry ?_ "_" table)
    (modify-syntax-entry ?. "." table)
    (modify-syntax-entry ?* "." table)
    (modify-syntax-entry ?? "." table)
    (modify-syntax-entry ?: "." table)
    (modify-syntax-entry ?= "." table)
    (modify-syntax-entry ?, "." table)
    (modify-syntax-entry ?\; "." table)
    (modify-syntax-entry ?' "." table)
    (modify-syntax-entry ?/ "." table)
    (modify-syntax-entry ?{ "(}" table)
    (modify-syntax-entry ?} "){" table)
    (modify-syntax-entry ?\[ "(]" table)
    (modify-syntax-entry ?\] ")[" table)
    (modify-syntax-entry ?\( "()" table)
    (modify-syntax-entry ?\) ")(" table)
    table)
  "Syntax table for `planlang-mode'.")

(defun planlang-indent-line ()
  "Indent the current line by `planlang-indent-offset' per open bracket.
A line that starts with a closing bracket goes back one level."
  (interactive)
  (let* ((depth (save-excursion (car (syntax-ppss (line-beginning-position)))))
         (closing (save-excursion (back-to-indentation) (looking-at "[]})]")))
         (column (* planlang-indent-offset (max 0 (- depth (if closing 1 0)))))
         (offset (- (current-column) (current-indentation))))
    (indent-line-to column)
    (when (> offset 0) (move-to-column (+ column offset)))))

;;;###autoload
(define-derived-mode planlang-mode prog-mode "planlang"
  "Major mode for planlang distributed-training plans (.plan files)."
  :syntax-table planlang-mode-syntax-table
  (setq-local comment-start "# ")
  (setq-local comment-start-skip "#+[ \t]*")
  (setq-local comment-end "")
  (setq-local indent-line-function #'planlang-indent-line)
  (setq-local indent-tabs-mode nil)
  (setq-local electric-indent-chars (append '(?\} ?\] ?\)) electric-indent-chars))
  (setq-local font-lock-defaults '(planlang-font-lock-keywords nil nil nil nil))
  (setq-local font-lock-multiline nil))

;;;###autoload
(add-to-list 'auto-mode-alist '("\\.plan\\'" . planlang-mode))

;; The language server: `M-x eglot' in a .plan buffer runs `planlang lsp' (stdio).
(defvar eglot-server-programs)
;;;###autoload
(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs '(planlang-mode "planlang" "lsp")))

(provide 'planlang-mode)
;;; planlang-mode.el ends here
