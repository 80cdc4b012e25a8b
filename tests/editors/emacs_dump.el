;;; emacs_dump.el --- font-lock and indentation of planlang-mode, for tests/editors  -*- lexical-binding: t; -*-
;; emacs --batch -Q -l editors/emacs/planlang-mode.el -l THIS OUT FILES...
;; Writes OUT: {file: {"faces": [[line, column, face], ...] at the start of every word,
;;                     "reindented": the text after stripping all indentation and `indent-region'}}.
(require 'json)
(let* ((out (pop command-line-args-left))
       (result nil))
  (dolist (file command-line-args-left)
    (with-temp-buffer
      (insert-file-contents file)
      (let ((buffer-file-name file))
        (set-auto-mode))             ; the auto-mode-alist entry must pick planlang-mode
      (unless (eq major-mode 'planlang-mode)
        (error "auto-mode-alist did not select planlang-mode for %s" file))
      (font-lock-ensure)
      (let ((faces nil))
        (goto-char (point-min))
        (while (re-search-forward "\\_<[A-Za-z_]" nil t)
          (let* ((pos (match-beginning 0))
                 (face (get-text-property pos 'face)))
            (push (vector (line-number-at-pos pos) (- pos (save-excursion (goto-char pos) (line-beginning-position)))
                          (format "%s" (if (consp face) (car face) (or face ""))))
                  faces))
          (skip-syntax-forward "w_"))
        (goto-char (point-min))
        (while (re-search-forward "^[ \t]+" nil t) (replace-match ""))
        (let ((inhibit-message t)) (indent-region (point-min) (point-max)))
        (push (cons file (list (cons 'faces (vconcat (nreverse faces)))
                               (cons 'reindented (buffer-substring-no-properties (point-min) (point-max)))))
              result))))
  (with-temp-file out (insert (json-encode result))))
