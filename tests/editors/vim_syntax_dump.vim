" Dump the syntax group at the first character of every word of each file in the argument list, as
" JSON {file: [[line, column (0-based), group], ...]}, to the file named by g:plan_dump_out.
" Run: vim -u NONE -i NONE -N -es --cmd 'set rtp^=editors/vim' -S THIS -c 'qa!' FILES...
" (tests/editors/test_vim_emacs.py). Loading the syntax, indent and ftplugin files fails loudly here.
filetype plugin indent on
syntax on
let s:result = {}
for s:file in argv()
  execute 'edit ' . fnameescape(s:file)
  if &filetype !=# 'plan'
    throw 'ftdetect did not set filetype=plan for ' . s:file
  endif
  let s:rows = []
  for s:lnum in range(1, line('$'))
    let s:text = getline(s:lnum)
    let s:col = match(s:text, '\<\h')
    while s:col >= 0
      call add(s:rows, [s:lnum, s:col, synIDattr(synID(s:lnum, s:col + 1, 1), 'name')])
      let s:col = match(s:text, '\<\h', matchend(s:text, '\<\h\w*', s:col))
    endwhile
  endfor
  let s:result[s:file] = s:rows
endfor
call writefile([json_encode(s:result)], g:plan_dump_out)
